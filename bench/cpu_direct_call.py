"""What a compiled CPU decode step costs per call through torch.compile and called directly.

The ``cpu`` executor calls a compiled step directly under torch.compile's own guards
(``runtime/cpu/direct_call.py``). This times one decode step of a model (default: the bundled k3-nano,
fp32, the executor's default threads) with the same arguments, interleaved round after round:
  through torch.compile   the compiled function (frame hook, guards, the bytecode gathering ~190 inputs)
  direct                  ``DirectStep``: torch.compile's guard check, then the graph with weights gathered once
  executor prep           what the executor does eagerly before either (``step_pages``, ``cache_tensors``)
each as the minimum and median µs per call over --rounds x --calls, beside the model's bandwidth floor
per token from the copy bandwidth measured in the same run. The step mutates its caches, so the calls
decode the same position again and again: the timing is the step's, the tokens are moot.
Writes bench/results/cpu_direct_call.json.

    python bench/cpu_direct_call.py [--model k3-nano] [--threads N] [--rounds 40] [--calls 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from script_args import MODEL_HELP, add_out_arg, positive_int, run, thread_count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="k3-nano", help=MODEL_HELP)
    ap.add_argument("--threads", type=thread_count, default=None, help="torch threads (default: the executor's choice)")
    ap.add_argument("--rounds", type=positive_int, default=40, help="timed rounds of every way (default 40)")
    ap.add_argument("--calls", type=positive_int, default=20, help="calls per timed block (default 20)")
    add_out_arg(ap, "cpu_direct_call.json")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

    from nonstop import LLM, SamplingParams
    from nonstop.hostinfo import copy_bandwidth, decode_floor, write_result
    from nonstop.runtime.cpu.cache_view import cache_tensors, step_pages
    from nonstop.runtime.executors import streamed_weight_bytes
    from nonstop.threads import set_threads

    set_threads(args.threads)  # before the executor, which keeps an explicit choice
    llm = LLM(args.model, dtype="float32", backend="cpu")
    ex = llm.executor
    if ex._direct is None:
        sys.exit("direct calls are off (NONSTOP_CPU_DIRECT=0): nothing to compare")
    seen = {}
    run_compiled = ex.run_compiled

    def keep(input_ids, cache, batch):  # the engine's last decode step: its arguments are replayed below
        seen.update(ids=input_ids, cache=cache, batch=batch)
        return run_compiled(input_ids, cache, batch)

    ex.run_compiled = keep
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    llm.generate(prompt_token_ids=[[5, 6, 7, 8]], sampling=params)
    cache, batch = seen["cache"], seen["batch"]
    copy = copy_bandwidth()["copy_GBps"]
    load = [os.getloadavg()]
    with torch.inference_mode():  # as the engine calls the executor
        step_args = (ex.program, ex.table, seen["ids"], batch.slots, batch.start, *step_pages(cache, batch))
        step_args += (cache_tensors(cache),)
        if ex._direct(*step_args) is None:
            sys.exit("the replayed step did not go direct: torch.compile's guards refused it")
        ways = {
            "through torch.compile": lambda: ex._step(*step_args),
            "direct": lambda: ex._direct(*step_args),
            "executor prep": lambda: (step_pages(cache, batch), cache_tensors(cache)),
        }
        times = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, call in ways.items():
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    call()
                times[name].append((time.perf_counter() - t0) / args.calls * 1e6)
    load.append(os.getloadavg())
    rows = {
        name: {"min_us": round(min(v), 1), "median_us": round(statistics.median(v), 1)} for name, v in times.items()
    }
    saved = {k: round(rows["through torch.compile"][k] - rows["direct"][k], 1) for k in ("min_us", "median_us")}
    bytes_per_token = streamed_weight_bytes(llm.cfg, torch.float32, "cpu", "cpu")[0]  # as the LLM packs them
    result = write_result(
        args.out,
        "cpu_direct_call",
        {
            "model": args.model,
            "threads": torch.get_num_threads(),
            "rounds": args.rounds,
            "calls_per_round": args.calls,
            "load_average": [[round(v, 2) for v in la] for la in load],
            "floor": decode_floor(bytes_per_token, copy),
            "per_call": rows,
            "saved_per_call_us": saved,
        },
    )
    for name, row in rows.items():
        print(f"{name:<24} min {row['min_us']:8.1f} us  median {row['median_us']:8.1f} us")
    floor_us = result["floor"]["floor_ms_per_token"] * 1e3
    print(f"saved per call: {saved['min_us']} us (min), {saved['median_us']} us (median)")
    print(f"bandwidth floor {floor_us:.0f} us per token")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run(main)
