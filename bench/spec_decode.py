"""Speculative decoding on a CPU (or a GPU, ``--device cuda``): mean accepted length and speedup per drafter.

For each prompt (batch 1, greedy, ``--max-tokens`` new tokens, end-of-sequence ignored so every run
generates the same count) the plain engine and each drafter (n-gram prompt lookup, the DSpark
drafter shipped with the model) run back to back, interleaved so machine load affects them alike;
with ``--repeats`` R each prompt runs R times per mode and the fastest decode time counts (the
machine is shared: the minimum is the least disturbed run).
Reported per prompt set (held-out prose from ``nonstop/assets/heldout_sample.txt``; repetitive text:
a held-out paragraph followed by its own beginning, which a model continues by copying):
  * mean accepted length τ = tokens emitted per verification step (incl. the corrected/bonus token),
  * draft acceptance = accepted drafts / drafted tokens,
  * decode tokens/s (after the first token) and the speedup over the plain run of the same build,
  * whether every greedy output equals the plain run's (it must).
Writes JSON to bench/results/ with the machine, its load average and the command.

    python bench/spec_decode.py [--model k3-nano] [--num-tokens 2,4] [--prompts 8] [--max-tokens 64]
    python bench/spec_decode.py --device cuda --backend superop       # the Triton kernels, on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from decode import use_device
from script_args import (
    MODEL_HELP,
    choice_list,
    decode_tokens,
    int_list,
    out_file,
    positive_int,
    results_path,
    run,
    thread_count,
)

from nonstop.engine.speculative.config import METHODS
from nonstop.hostinfo import command_line, copy_bandwidth, decode_floor, environment
from nonstop.program.ir import MAX_STEP_ROWS
from nonstop.runtime.executors import BACKENDS, streamed_weight_bytes
from nonstop.threads import set_threads

HELDOUT = Path(__file__).resolve().parent.parent / "nonstop" / "assets" / "heldout_sample.txt"


def prompt_sets(tokenizer, n: int, prompt_tokens: int) -> dict[str, list[list[int]]]:
    paragraphs = [p for p in HELDOUT.read_text().split("\n") if len(p) > 400]
    heldout, repetitive = [], []
    for p in paragraphs[:n]:
        ids = tokenizer.encode(p, add_special_tokens=False)
        heldout.append(ids[:prompt_tokens])
        repetitive.append(
            ids[: 2 * prompt_tokens] + tokenizer.encode("\n\n", add_special_tokens=False) + ids[: prompt_tokens // 2]
        )
    return {"heldout": heldout, "repetitive": repetitive}


def summarize(outs: list, times: list[float]) -> dict:
    decode_s = sum(times)
    decoded = sum(len(o.token_ids) - 1 for o in outs)
    row = {
        "decode_tokens": decoded,
        "decode_time_s": round(decode_s, 6),
        "decode_tokens_per_s": round(decoded / decode_s, 2),
    }
    if "verify_steps" in outs[0].metrics:
        steps = sum(o.metrics["verify_steps"] for o in outs)
        drafted = sum(o.metrics["drafted_tokens"] for o in outs)
        accepted = sum(o.metrics["accepted_tokens"] for o in outs)
        row.update(
            mean_accepted_length=round(decoded / steps, 3),
            draft_acceptance=round(accepted / drafted, 3) if drafted else None,  # nothing drafted: undefined
            drafted_tokens=drafted,
            accepted_tokens=accepted,
            verify_steps=steps,
        )
        row["per_prompt_mean_accepted_length"] = [round(o.metrics["mean_accepted_length"], 2) for o in outs]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="k3-nano", help=MODEL_HELP)
    ap.add_argument(
        "--methods",
        type=choice_list(METHODS),
        default=",".join(METHODS),
        help=f"drafters to compare with the plain run, comma-separated from {', '.join(METHODS)} (default all)",
    )
    ap.add_argument(
        "--num-tokens",
        type=int_list(1, MAX_STEP_ROWS - 1),
        default="2,4",
        help=f"drafts per verification step, comma-separated, each in 1..{MAX_STEP_ROWS - 1}: one run per value "
        "(default 2,4)",
    )
    ap.add_argument("--prompts", type=positive_int, default=8, help="prompts per set (default 8)")
    ap.add_argument("--prompt-tokens", type=positive_int, default=48, help="tokens of a held-out prompt (default 48)")
    ap.add_argument("--max-tokens", type=decode_tokens, default=64, help="new tokens per run, >= 2 (default 64)")
    ap.add_argument("--threads", type=thread_count, default=1, help="torch threads (default 1)")
    ap.add_argument(
        "--repeats",
        type=positive_int,
        default=2,
        help="runs per prompt and mode; the fastest decode time counts (default 2)",
    )
    ap.add_argument(
        "--backend",
        default="reference",
        choices=["auto", *BACKENDS],
        help="executor of every engine (default reference; superop and megakernel need --device cuda)",
    )
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N: where every engine runs")
    ap.add_argument(
        "--out",
        type=out_file,
        default=None,
        help="JSON path (default bench/results/spec_decode_<cpu or cuda>_<model>.json)",
    )
    args = ap.parse_args()
    set_threads(args.threads)  # an explicit choice: the cpu executor keeps it (torch.set_num_threads alone it resets)
    device = use_device(args.device)  # a ValueError (one error line) when this machine has no such device

    from nonstop import LLM, SamplingParams

    load_before = os.getloadavg()
    ks = args.num_tokens
    engines = {"plain": LLM(args.model, backend=args.backend, device=device, max_batch=1, batch_invariant=True)}
    for m in args.methods:
        for k in ks:
            engines[f"{m}-k{k}"] = LLM(
                args.model,
                backend=args.backend,
                device=device,
                max_batch=1,
                batch_invariant=True,
                speculative={"method": m, "num_tokens": k},
            )
    methods = [name for name in engines if name != "plain"]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    sets = prompt_sets(engines["plain"].tokenizer, args.prompts, args.prompt_tokens)
    for llm in engines.values():  # warm-up
        llm.generate(
            prompt_token_ids=[sets["heldout"][0]], sampling=SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
        )

    results = {}
    for set_name, prompts in sets.items():
        outs: dict[str, list] = {name: [] for name in engines}
        times: dict[str, list[float]] = {name: [] for name in engines}
        for i, prompt in enumerate(prompts):
            best: dict[str, float] = {}
            for _ in range(args.repeats):
                for name, llm in engines.items():  # interleaved: the same load for every mode
                    if device.type == "cuda":  # nothing of the last run still queued on the GPU
                        torch.cuda.synchronize()
                    out = llm.generate(prompt_token_ids=[prompt], sampling=params)[0]
                    best[name] = min(best.get(name, float("inf")), out.metrics["decode_time_s"])
                    if len(outs[name]) == i:
                        outs[name].append(out)
            for name in engines:
                times[name].append(best[name])
            print(
                f"{set_name} {i + 1}/{len(prompts)}: "
                + ", ".join(f"{n} τ={o[-1].metrics.get('mean_accepted_length') or 1:.2f}" for n, o in outs.items()),
                file=sys.stderr,
                flush=True,
            )
        rows = {name: summarize(o, times[name]) for name, o in outs.items()}
        for name in methods:
            rows[name]["greedy_identical_to_plain"] = all(
                a.token_ids == b.token_ids for a, b in zip(outs[name], outs["plain"])
            )
            # from the unrounded times: a short run's round to 0.0 ms
            rows[name]["speedup_over_plain"] = round(sum(times["plain"]) / sum(times[name]), 3)
        results[set_name] = {"prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts], "modes": rows}

    cfg = engines["plain"].cfg
    nbytes, weights = streamed_weight_bytes(cfg, engines["plain"].dtype, args.backend, device)
    floor = {**decode_floor(nbytes, copy_bandwidth(device)["copy_GBps"]), "weights": weights}
    result = {
        "benchmark": "spec_decode",
        "command": command_line(),
        "model": args.model,
        "model_dir": str(engines["plain"].model_dir) if engines["plain"].model_dir else None,
        "target": {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size},
        "backend": args.backend,
        "device": str(device),
        "dtype": str(engines["plain"].dtype).removeprefix("torch."),
        "batch": 1,
        "threads": torch.get_num_threads(),  # --threads, as the runs used it
        "greedy": True,
        "num_draft_tokens": ks,
        "max_tokens": args.max_tokens,
        "results": results,
        "bandwidth_floor": floor,
        "repeats": args.repeats,
        "notes": "decode time excludes prefill and the first token (fastest of the repeats per prompt); "
        "speedup = plain decode time / speculative decode time on the same prompts, runs interleaved",
        "machine": environment(device) | {"load_average_before": [round(x, 2) for x in load_before]},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    out = Path(args.out) if args.out else results_path(f"spec_decode_{device.type}_{Path(args.model).name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'set':<11} {'mode':<10} {'tau':>6} {'accept':>7} {'tok/s':>7} {'speedup':>8} identical")
    for set_name, r in results.items():
        for name, row in r["modes"].items():
            tau = row.get("mean_accepted_length", 1.0)
            accept, speedup = row.get("draft_acceptance"), row.get("speedup_over_plain", 1.0)
            accept = float("nan") if accept is None else accept  # plain decoding, or nothing drafted
            identical = row.get("greedy_identical_to_plain", "")
            print(
                f"{set_name:<11} {name:<10} {tau:>6.2f} {accept:>7.2f} {row['decode_tokens_per_s']:>7.1f} "
                f"{speedup:>8.2f} {identical}"
            )
    print(
        f"bandwidth floor of plain decoding: {floor['floor_tokens_per_s']:.0f} tok/s "
        f"({floor['bytes_per_token'] / 1e6:.1f} MB/token at a measured {floor['copy_GBps']:.1f} GB/s copy)"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    run(main)
