"""CPU decode beside other busy processes: the default thread count against every core.

k3-nano (or --model), ``cpu`` backend, batch 1, greedy, run in a fresh worker process per configuration while
--competitors other processes spin (each a Python busy loop at normal priority), alternated round after
round:
  default      the executor's own choice (``nonstop/threads.py``: cores other processes keep busy are left)
  all cores    NONSTOP_THREADS = the physical cores, whatever else runs
  one thread   NONSTOP_THREADS = 1
plus each configuration once on the quiet machine (no competitor). Decode tokens/s from the engine's own
per-token clock (best and median of --runs generations per worker), beside the bandwidth floor from the copy
bandwidth measured quiet in the same run. Writes bench/results/cpu_busy.json.

    python bench/cpu_busy.py [--model k3-nano] [--competitors 1] [--rounds 3] [--runs 3] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from script_args import MODEL_HELP, add_out_arg, decode_tokens, positive_int, run

ROOT = Path(__file__).resolve().parent.parent

WORKER = """
import json, sys
from nonstop import LLM, SamplingParams
llm = LLM(sys.argv[1], dtype="float32", backend="cpu")
params = SamplingParams(max_tokens=int(sys.argv[2]), temperature=0, ignore_eos=True)
prompt = list(range(5, 37))
llm.generate(prompt_token_ids=[prompt], sampling=SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
rates = [llm.generate(prompt_token_ids=[prompt], sampling=params)[0].metrics["decode_tokens_per_s"]
         for _ in range(int(sys.argv[3]))]
print(json.dumps({"threads": llm.executor.stats["threads"], "tokens_per_s": rates}))
"""


def run_worker(model: str, tokens: int, runs: int, threads: int | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NONSTOP_THREADS", None)
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["NONSTOP_THREADS"] = str(threads)
    out = subprocess.run(
        [sys.executable, "-c", WORKER, model, str(tokens), str(runs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="k3-nano", help=MODEL_HELP)
    ap.add_argument(
        "--competitors", type=positive_int, default=1, help="busy processes running beside the decode (default 1)"
    )
    ap.add_argument(
        "--rounds", type=positive_int, default=3, help="rounds of every configuration beside the busy ones (default 3)"
    )
    ap.add_argument("--runs", type=positive_int, default=3, help="timed generations per worker (default 3)")
    ap.add_argument(
        "--tokens", type=decode_tokens, default=64, help="new tokens per timed generation, >= 2 (default 64)"
    )
    add_out_arg(ap, "cpu_busy.json")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    from nonstop.hostinfo import copy_bandwidth, decode_floor, write_result
    from nonstop.runtime.executors import streamed_weight_bytes
    from nonstop.threads import physical_cores
    from nonstop.weights.resolve import resolve_model

    cfg = resolve_model(args.model)[0]  # before anything is measured: a model that does not resolve is one line
    cores = physical_cores()
    configs = {"default": None, "all cores": cores, "one thread": 1}
    torch.set_num_threads(cores)
    copy = copy_bandwidth()["copy_GBps"]
    floor = decode_floor(streamed_weight_bytes(cfg, torch.float32, "cpu", "cpu")[0], copy)  # the worker's LLM
    rows: dict[str, dict] = {name: {"quiet": [], "busy": [], "threads": {}} for name in configs}
    for name, threads in configs.items():
        got = run_worker(args.model, args.tokens, args.runs, threads)
        rows[name]["quiet"] += got["tokens_per_s"]
        rows[name]["threads"]["quiet"] = got["threads"]
        print(f"quiet: {name}: {got['threads']} threads, {max(got['tokens_per_s']):.1f} tok/s", file=sys.stderr)
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.competitors)]
    loads = []
    try:
        for r in range(args.rounds):
            for name, threads in configs.items():
                got = run_worker(args.model, args.tokens, args.runs, threads)
                rows[name]["busy"] += got["tokens_per_s"]
                rows[name]["threads"]["busy"] = got["threads"]
                print(
                    f"round {r + 1}, {args.competitors} busy: {name}: {got['threads']} threads, "
                    f"{max(got['tokens_per_s']):.1f} tok/s",
                    file=sys.stderr,
                    flush=True,
                )
            loads.append(os.getloadavg())
    finally:
        for p in spin:
            p.kill()
            p.wait(timeout=10)
    summary = {
        name: {
            "threads": row["threads"],
            **{
                f"{when}_tokens_per_s": {
                    "best": round(max(row[when]), 1),
                    "median": round(statistics.median(row[when]), 1),
                }
                for when in ("quiet", "busy")
            },
            "busy_percent_of_floor": round(100 * statistics.median(row["busy"]) / floor["floor_tokens_per_s"], 1),
            "all_runs": {when: [round(x, 1) for x in row[when]] for when in ("quiet", "busy")},
        }
        for name, row in rows.items()
    }
    write_result(
        args.out,
        "cpu_busy",
        {
            "model": args.model,
            "competitors": args.competitors,
            "physical_cores": cores,
            "floor": floor,
            "load_average_per_round": loads,
            "configurations": summary,
        },
    )
    print(f"floor {floor['floor_tokens_per_s']:.0f} tok/s (copy {copy:.1f} GB/s, quiet)")
    for name, s in summary.items():
        print(
            f"{name:<11} threads {s['threads']}: quiet {s['quiet_tokens_per_s']['median']:.1f} tok/s, "
            f"with {args.competitors} busy {s['busy_tokens_per_s']['median']:.1f} median / "
            f"{s['busy_tokens_per_s']['best']:.1f} best"
        )
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    run(main)
