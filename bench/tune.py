"""The super-operator agent against the built-in kernels: K3 and Kimi-Linear super-ops at batch 1..8.

For each model and each super-op kind of its Program, ``nonstop tune``'s loop (``nonstop.tune.loop.tune``)
runs on the GPU: the built-in kernel is verified and timed, then the proposer's candidates are verified
and timed the same way in the same run (sandboxed child per candidate; CUDA events around each launch,
a never-repeated pairing of fresh weights and inputs per launch, the L2 flushed; see docs/tune.md).
Per (kind, weight shape, batch B): the built-in's median, the agent's best median, the speed-up, and
each as a fraction of the op's bandwidth floor (bytes read + written from the cost model at the GPU's
peak bandwidth: floor / time, 100% = at the floor). Winners go to a store of this run (``--store``;
default a file beside the results, never the user's store unless asked).

Shapes are the models' own widths (random weights; only the config is read). An op whose weights
exceed ``--max-op-gib`` is skipped and listed (every verification state carries a copy of its weights).

    python bench/tune.py                                     # kimi-k3 + kimi-linear-48b-a3b, B = 1,2,4,8, search
    python bench/tune.py --models kimi-k3 --kinds kda_core,mla_attn --rounds 3
    python bench/tune.py --proposer llm --llm-base-url http://127.0.0.1:8000/v1 --llm-model k3-nano
    python bench/tune.py --dry-run                           # CPU: the narrow twins, verified and untimed, minutes

Without a GPU nothing is timed: the rows say "untimed" and the results are pending. Results: JSON to
``bench/results/tune_<gpu>.json`` (and ``$OUT`` when set) with the GPU, driver, torch / triton versions
and the exact command; a table last on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from script_args import choice_list, int_list, out_file, positive_float, positive_int, run  # noqa: E402

from nonstop.commands.tune import add_proposer_args, llm_proposer  # noqa: E402
from nonstop.config import ModelConfig  # noqa: E402
from nonstop.hostinfo import environment  # noqa: E402
from nonstop.kernels import KERNELS  # noqa: E402
from nonstop.program.ir import MAX_STEP_ROWS  # noqa: E402
from nonstop.program.twin import narrow_twin  # noqa: E402
from nonstop.tune.cases import layers_for  # noqa: E402
from nonstop.tune.loop import category, tune  # noqa: E402
from nonstop.tune.search import SearchProposer  # noqa: E402
from nonstop.tune.target import make_target  # noqa: E402

MODELS = ("kimi-k3", "kimi-linear-48b-a3b")
DRY_KINDS = ("linear_residual", "kda_core", "mla_attn")
KINDS = tuple(sorted(k for k in KERNELS if k != "sample"))  # the super-op kinds with a kernel to tune (as nonstop tune)


def kinds_of(cfg: ModelConfig) -> list[str]:
    from nonstop.program.lower import lower
    from nonstop.tune.cases import random_model_meta

    with torch.device("meta"):
        program = lower(random_model_meta(cfg.with_num_layers(min(cfg.num_hidden_layers, 8))))
    return sorted({op.kind for op in program.ops})


def proposer_for(kind: str, args):
    if args.proposer == "llm":
        return llm_proposer(args)
    return SearchProposer(kind)


def run_kind(model: str, cfg: ModelConfig, kind: str, args, device, dtype, store: Path) -> dict:
    target = make_target(kind, model, cfg, dtype, device, args.rows, 1, args.context)
    budget = args.max_op_gib * 2**30
    big = [s for s in target.shapes if s.weight_bytes > budget]
    target.shapes = [s for s in target.shapes if s.weight_bytes <= budget]
    row = {
        "model": model,
        "kind": kind,
        "layers": target.cfg.num_hidden_layers,
        "skipped": [
            f"{s.key}: {s.weight_bytes / 2**30:.1f} GiB of weights > --max-op-gib {args.max_op_gib}" for s in big
        ]
        + target.skipped,
    }
    if not target.shapes:
        return {**row, "shapes": []}
    t0 = time.perf_counter()
    report = tune(
        target,
        proposer_for(kind, args),
        args.rounds,
        args.candidates,
        store,
        args.timeout,
        say=lambda m: print(f"[{model} {kind}] {m}", flush=True),
    )
    shapes = []
    for s in target.shapes:
        base = report.baseline.get(s.key)
        best = report.best.get(s.key)
        best_t = best[1] if best else None
        entry = {
            "shape": s.key,
            "B": s.B,
            "bytes_moved": s.bytes_moved,
            "builtin_ms": base["median_ms"] if base else None,
            "best_ms": best_t["median_ms"] if best_t else None,
            "best_candidate": best[0].candidate.id if best else None,
            "floor_ms": base["floor_ms"] if base else None,
        }
        if base:
            entry["builtin_pct_of_floor"] = base["floor_ms"] / base["median_ms"]
        if base and best_t:
            entry.update(
                speedup=base["median_ms"] / best_t["median_ms"],
                best_pct_of_floor=base["floor_ms"] / best_t["median_ms"],
            )
        shapes.append(entry)
    rejected = {}
    for o in report.outcomes:
        if not o.accepted:
            rejected[category(o.reasons)] = rejected.get(category(o.reasons), 0) + 1
    return {
        **row,
        "seconds": round(time.perf_counter() - t0, 1),
        "candidates": len(report.outcomes),
        "accepted": sum(o.accepted for o in report.outcomes),
        "rejected": rejected,
        "shapes": shapes,
        "stored": report.stored,
    }


def table(results: list[dict], timed: bool) -> str:
    lines = [
        f"{'model':<20} {'kind':<17} {'B':>2} {'built-in ms':>11} {'% floor':>8} {'agent ms':>9} {'% floor':>8} "
        f"{'speed-up':>8}  shape"
    ]
    for r in results:
        for s in r["shapes"]:
            if timed and s["builtin_ms"] is not None:
                best = (
                    f"{s['best_ms']:>9.4f} {s['best_pct_of_floor']:>8.0%} {s['speedup']:>7.2f}x"
                    if s.get("best_ms")
                    else f"{'-':>9} {'-':>8} {'-':>8}"
                )
                lines.append(
                    f"{r['model']:<20} {r['kind']:<17} {s['B']:>2} {s['builtin_ms']:>11.4f} "
                    f"{s['builtin_pct_of_floor']:>8.0%} {best}  {s['shape'][:60]}"
                )
            else:
                verified = "verified" if s["best_candidate"] else "none verified"
                lines.append(
                    f"{r['model']:<20} {r['kind']:<17} {s['B']:>2} {'pending':>11} {'':>8} {'untimed':>9} "
                    f"{'':>8} {'':>8}  {verified}: {s['shape'][:50]}"
                )
        for why in r["skipped"]:
            lines.append(f"{r['model']:<20} {r['kind']:<17}    skipped: {why[:100]}")
    lines.append(
        "% floor = bandwidth floor / median time (100% = at the floor); "
        "floor = bytes read + written / peak HBM bandwidth"
    )
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"comma-separated presets or checkpoint dirs (default {','.join(MODELS)})",
    )
    ap.add_argument(
        "--kinds",
        type=choice_list(KINDS),
        default=None,
        help=f"comma-separated super-op kinds from {', '.join(KINDS)} (default: all kinds of each model's Program)",
    )
    ap.add_argument(
        "--rows",
        type=int_list(1, MAX_STEP_ROWS),
        default="1,2,4,8",
        help="batch sizes B (decode, T = 1), default 1,2,4,8",
    )
    add_proposer_args(ap, rounds=2)
    ap.add_argument(
        "--context", type=positive_int, default=1024, help="tokens cached per sequence in timed steps (default 1024)"
    )
    ap.add_argument(
        "--max-op-gib", type=positive_float, default=2.0, help="skip ops whose weights exceed this (GiB), default 2"
    )
    ap.add_argument(
        "--timeout", type=positive_float, default=600.0, help="seconds per candidate's verification (default 600)"
    )
    ap.add_argument(
        "--store",
        type=out_file,
        default=None,
        help="tuning store to write (default: one beside the results of this run)",
    )
    ap.add_argument("--out", type=out_file, default=None, help="results JSON (default bench/results/tune_<gpu>.json)")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU: the models' narrow twins, kinds "
        + ",".join(DRY_KINDS)
        + ", 1 round x 1 candidate, B = 1,3; verified, untimed",
    )
    args = ap.parse_args(argv)
    if args.dry_run:
        args.rows, args.rounds, args.candidates = [1, 3], 1, 1
        args.kinds = args.kinds or list(DRY_KINDS)
    return args


def runs_of(args) -> list[tuple[str, ModelConfig, str]]:
    """(model, config, kind) for every kind of ``--kinds`` (default: all) that a model of ``--models`` has, every
    model resolved before anything runs; a ValueError when there is none."""
    from nonstop.weights.resolve import resolve_model

    runs = []
    for model in [m for m in args.models.split(",") if m]:
        cfg, _ = resolve_model(model)
        if args.dry_run:
            cfg = narrow_twin(cfg)
        for kind in args.kinds or kinds_of(cfg):
            try:
                layers_for(cfg, kind)
            except ValueError:
                continue
            runs.append((model, cfg, kind))
    if not runs:
        raise ValueError(f"no super-op of kind {','.join(args.kinds or KINDS)} in {args.models}: nothing to tune")
    return runs


def main(argv=None) -> dict:
    args = parse_args(argv)
    runs = runs_of(args)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type != "cuda":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    env = environment(device)
    name = (
        "tune_"
        + re.sub(r"[^A-Za-z0-9]+", "-", env.get("gpu") or ("cpu-dry-run" if args.dry_run else "cpu")).strip("-").lower()
        + ".json"
    )
    out = args.out or (Path(tempfile.gettempdir()) / name if args.dry_run else ROOT / "bench" / "results" / name)
    store = args.store or out.with_suffix(".store") / "tuning.json"
    results = [
        run_kind(model + (" (narrow twin)" if args.dry_run else ""), cfg, kind, args, device, dtype, store)
        for model, cfg, kind in runs
    ]
    timed = device.type == "cuda"
    report = {
        "environment": env,
        "command": " ".join([sys.executable] + sys.argv),
        "device": str(device),
        "dtype": str(dtype),
        "timed": timed,
        "status": "measured" if timed else "GPU numbers pending: verified under TRITON_INTERPRET=1, untimed",
        "store": str(store),
        "results": results,
    }
    paths = [out] + ([Path(os.environ["OUT"]) / name] if os.environ.get("OUT") else [])
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(table(results, timed))
    print("results: " + ", ".join(map(str, paths)))
    return report


if __name__ == "__main__":
    run(main)
