"""Every super-op's Triton kernel against its plain-torch twin, op by op, at full width (a GPU check).

For each shape (``bench/decode.py``'s shapes and random weights), a sequence is prefilled by the
reference model and one decode step runs through the Program with the twins. Right before each op
the step state (buffers, caches, recurrent state) is cloned twice: the twin runs on one copy, the
kernel on the other, whose outputs are poisoned with NaN first (``nonstop/runtime/twin_check.py``,
the steps of the kernel tests). Per op: max |kernel - twin| / max |twin| over every buffer it writes
and every cache/state tensor, and NaN left in its outputs. The first op over the tolerance is where a divergence starts.

    python bench/op_check.py --shapes kimi-k3-slice           # on a GPU
    python bench/op_check.py --dry-run                        # narrow twins, Triton's interpreter

Then one decode step after the same prefill through the twins and the superop kernels (no CUDA graph),
each against the reference model; ``--megakernel-step`` adds one eager megakernel launch, last, and
synchronises, so a fault is reported at its launch (run it under ``compute-sanitizer``).
JSON per shape (``op_check_<gpu>_<shape>.json``, with the machine and the torch / Triton / driver versions) to
``--out-dir``, else ``$OUT`` when set; a line per op on stdout. Exit status 1 when an op or a step erred, gave
NaN (non-finite logits) or was over its tolerance (``--tol``; a step's ``--step-tol``, by default only in a
``--dry-run``). Recorded runs: ``bench/results/op_check_nvidia-h200_*.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from script_args import choice_list, non_negative_float, out_folder, positive_int, run  # noqa: E402


def shape_list(text: str) -> list[str]:
    """``--shapes``: comma-separated names of ``bench/decode.py``'s shapes."""
    from decode import SHAPES

    return choice_list(SHAPES)(text)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--shapes",
        type=shape_list,
        default="llama-3.2-1b,kimi-k3-slice",
        help="comma-separated bench/decode.py shapes (llama-3.2-1b, kimi-linear-48b-a3b, kimi-k3-slice)",
    )
    ap.add_argument("--k3-layers", type=positive_int, default=None, help="layers of the kimi-k3 slice (default 4)")
    ap.add_argument("--llama-layers", type=positive_int, default=None, help="layers of llama-3.2-1b (default all)")
    ap.add_argument("--context", type=positive_int, default=131, help="tokens prefilled before the step (default 131)")
    ap.add_argument(
        "--tol", type=non_negative_float, default=2e-2, help="relative error of an op flagged (bf16 default 2e-2)"
    )
    ap.add_argument(
        "--step-tol",
        type=non_negative_float,
        default=None,
        help="relative error of a whole step flagged (default: 1e-3 in a --dry-run's fp32; none in bf16, where "
        "the step is off the reference by bf16 rounding and the routing flips it causes, the ops by --tol)",
    )
    ap.add_argument("--megakernel-step", action="store_true", help="also one eager megakernel step per shape (last)")
    ap.add_argument("--no-ops", dest="ops", action="store_false", help="skip the op-by-op comparison")
    ap.add_argument("--dry-run", action="store_true", help="narrow twins on the CPU under Triton's interpreter")
    ap.add_argument("--seed", type=int, default=0, help="seed of weights and inputs (default 0)")
    ap.add_argument("--out-dir", type=out_folder, default=None, help="where the JSON goes (default $OUT, else nowhere)")
    args = ap.parse_args(argv)
    if args.dry_run:
        from decode import interpret_triton

        interpret_triton(argv)  # the imports above defined the kernels: a command-line run starts again
        args.context = min(args.context, 12)
        args.step_tol = 1e-3 if args.step_tol is None else args.step_tol
    else:
        from nonstop.hostinfo import cuda_missing

        missing = cuda_missing("cuda", cpu_hint="--dry-run")
        if missing:
            ap.error(missing)
    return args


def check_ops(model, program, context: int, device, tol: float, seed: int) -> list[dict]:
    """Each op's kernel against its twin on clones of one step state (``compare_op``), ``ok`` within ``tol``
    and without NaN; an op that raises is reported with its ``error`` and ends the shape."""
    import torch
    from decode import prefilled

    from nonstop.kernels import KERNELS
    from nonstop.program.reference import REFERENCE, StepEnv
    from nonstop.runtime.twin_check import run_both

    gen = torch.Generator().manual_seed(seed + 1)
    cache, _ = prefilled(model, context, device, capacity=context + 4, gen=gen)
    batch = cache.batch([0], 1)
    env = StepEnv(program.allocate(1, device), cache, batch)
    env.buf["ids"].copy_(torch.randint(0, model.cfg.vocab_size, (1,), generator=gen))
    rows = []
    for op in program.ops:
        row = {"op": op.name, "kind": op.kind}
        try:
            run = run_both(op, env, KERNELS[op.kind], gen)
            if device.type == "cuda":
                torch.cuda.synchronize()
            row.update(compare_op(op, run))
            row["ok"] = row["rel_err"] <= tol and row["nan"] == 0
        except Exception as exc:  # noqa: BLE001 - report it; a CUDA fault ends the shape
            row.update(error=f"{type(exc).__name__}: {exc}"[:1000], ok=False)
        rows.append(row)
        print(op_line(row), flush=True)
        if "error" in row:
            break
        REFERENCE[op.kind](op, env)
        del run
    return rows


def compare_op(op, run) -> dict:
    """The kernel's step state against the twin's after ``op`` (``run``: ``twin_check.run_both``): the relative
    error of everything it writes (``twin_check.outputs``) and of every cache/state tensor that differs, the
    worst of them, and NaN in its outputs."""
    import torch
    from decode import rel_err

    from nonstop.runtime.twin_check import outputs, state_tensors

    written = outputs(op, run)
    errs = {name: rel_err(got, want) for name, (got, want) in written.items()}
    got_state = state_tensors(run.got)
    for name, t in state_tensors(run.want).items():
        e = rel_err(got_state[name], t)
        if e > 0:
            errs[f"state {name}"] = e
    worst = max(errs, key=errs.get) if errs else None
    nan = int(sum(int(torch.isnan(got.float()).sum()) for got, _ in written.values()))
    return {"worst": worst, "rel_err": errs.get(worst, 0.0), "errors": errs, "nan": nan}


def op_line(row: dict) -> str:
    """An op's line on stdout: its error and NaN count, or the exception it raised."""
    head = f"  {row['op']:<28} {row['kind']:<18}"
    if "error" in row:
        return f"{head} error: {row['error'][:300]}"
    return f"{head} {row['rel_err']:9.2e}  nan {row['nan']:<5} {row['worst']}" + (
        "" if row["ok"] else "   <-- over tolerance"
    )


def ops_summary(rows: list[dict]) -> str:
    """``N ops, n over tolerance, n erred; first <op>``: the ops compared, and where a divergence starts."""
    bad = [r for r in rows if not r["ok"]]
    erred = sum("error" in r for r in bad)
    first = f"; first {bad[0]['op']}" if bad else ""
    return f"  {len(rows)} ops, {len(bad) - erred} over tolerance, {erred} erred{first}"


def step_ok(entry: dict, tol: float | None) -> bool:
    """A step passes when it ran, its logits are finite and (with a ``tol``) its relative error is within it."""
    return "error" not in entry and entry["finite"] and (tol is None or entry["rel_err"] <= tol)


def step_checks(model, program, context: int, device, seed: int, megakernel: bool, tol: float | None) -> dict:
    """One decode step after a prefill, each executor against the reference model (max rel error of the
    logits, and ``ok``: ``step_ok`` within ``tol``): the twins, the superop kernels without a CUDA graph, and
    (``megakernel``) one eager megakernel launch, last: a fault there ends the CUDA context."""
    import copy

    import torch
    from decode import prefilled, rel_err

    from nonstop.runtime.superop import SuperOpExecutor

    gen = torch.Generator().manual_seed(seed + 2)
    cache, _ = prefilled(model, context, device, capacity=context + 4, gen=gen)
    ids = torch.randint(0, model.cfg.vocab_size, (1, 1), generator=gen).to(device)
    want = model(ids, copy.deepcopy(cache), cache.batch([0], 1), last_only=True).float()
    builders = {
        "twins": lambda: SuperOpExecutor(model, use_kernels=False, graphs=False, program=program),
        "superop": lambda: SuperOpExecutor(model, use_kernels=True, graphs=False, program=program),
    }
    if megakernel:
        from nonstop.runtime.megakernel import MegakernelExecutor

        builders["megakernel"] = lambda: MegakernelExecutor(model, graphs=False, program=program)
    out = {}
    for name, build in builders.items():
        try:
            c = copy.deepcopy(cache)
            got = build().forward(ids, c, c.batch([0], 1), last_only=True).float()
            if device.type == "cuda":
                torch.cuda.synchronize()
            out[name] = {"rel_err": rel_err(got, want), "finite": bool(torch.isfinite(got).all())}
        except Exception as exc:  # noqa: BLE001
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
        out[name]["ok"] = step_ok(out[name], tol)
        print(f"  step vs the reference model, {name}: {out[name]}", flush=True)
    return out


def failures(report: dict) -> int:
    """Ops and steps of a shape's report that erred, gave NaN or were over their tolerance."""
    return sum(not r["ok"] for r in report.get("ops", [])) + sum(not s["ok"] for s in report["step"].values())


def main(argv=None) -> int:
    """Check each shape, write its report; the number of failures (``failures``) over all shapes."""
    args = parse_args(argv)
    import torch
    from decode import build_model, shape_config

    from nonstop.hostinfo import environment
    from nonstop.program.lower import lower

    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    out_dir = args.out_dir or os.environ.get("OUT")
    layers = {"llama-3.2-1b": args.llama_layers, "kimi-k3-slice": args.k3_layers}
    failed = 0
    for name in args.shapes:
        cfg = shape_config(name, layers.get(name), args.dry_run)
        print(f"{name}: {cfg.num_hidden_layers} layers, context {args.context}", flush=True)
        report = {
            "bench": "op_check",
            "command": " ".join(["python3", "bench/op_check.py", *(sys.argv[1:] if argv is None else argv)]),
            "environment": environment(device),
            "shape": name,
            "layers": cfg.num_hidden_layers,
            "context": args.context,
            "tol": args.tol,
            "step_tol": args.step_tol,
        }
        with torch.inference_mode():
            model = build_model(cfg, dtype, device, args.seed)
            program = lower(model)
            if args.ops:
                report["ops"] = check_ops(model, program, args.context, device, args.tol, args.seed)
                print(ops_summary(report["ops"]), flush=True)
            report["step"] = step_checks(
                model, program, args.context, device, args.seed, args.megakernel_step, args.step_tol
            )
        failed += failures(report)
        if out_dir:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            where = re.sub(r"[^a-z0-9]+", "-", (report["environment"].get("gpu") or "cpu").lower())
            (Path(out_dir) / f"op_check_{where}_{name}.json").write_text(json.dumps(report, indent=1) + "\n")
        del model, program
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if failed:
        print(f"{failed} failure(s): ops or steps that erred or were over tolerance (exit status 1)", file=sys.stderr)
    return failed


def cli() -> None:
    """``main()`` run as a command: exit status 1 when an op or a step failed."""
    sys.exit(1 if main() else 0)


if __name__ == "__main__":
    run(cli)
