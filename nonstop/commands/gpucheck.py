"""``nonstop gpucheck``: compile every kernel of a decode step for an H100 (sm_90a) without a GPU, and check it."""

from __future__ import annotations

import json
import os
import sys

from nonstop.commands.common import positive_int

DESCRIPTION = """Lower one decode step of MODEL (a preset or a directory holding config.json: shapes only, the weights
stay on the meta device and no checkpoint is read) to sm_90a with Triton's NVIDIA backend and ptxas,
exactly as the kernels would launch on an H100 (block sizes, grids, warps, PDL, the megakernel's tables
and launch options), and check what a GPU would get: no register spills; registers and shared memory
that let a CTA run (CTAs per SM); an acquire after every spin-wait in the PTX; 16-byte loads in every
loop that streams a weight (MXFP4 bytes included; their scales no more loads than the bytes, not one per
element; an embedding row under 512 bytes, which one warp reads, as wide as it allows: row / 32). Prints
a table kernel x shape: warps, registers, spill bytes, shared memory, CTAs per SM, grid, weight load
widths. Exit status 1 when a kernel violates a check, 2 on bad input.

Without --model the three preset shapes are checked: llama-3.2-1b (all layers), kimi-linear-48b-a3b and
kimi-k3 (their first 4 layers: every kind of layer). --triton DIR repeats the check with the Triton
installed in DIR (e.g. `pip install --target DIR --no-deps triton==3.6.0`, the GPU machines' version)."""


def add_parser(sub) -> None:
    import argparse

    p = sub.add_parser(
        "gpucheck",
        help="compile the step's kernels for sm_90a offline and check spills, occupancy, acquires, load widths",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model", "-m", default=None, help="preset name or checkpoint directory (default: the three preset shapes)"
    )
    p.add_argument(
        "--num-layers",
        type=positive_int,
        default=None,
        help="keep only the first N layers (default: all for a --model; without one, at most N of each preset shape)",
    )
    p.add_argument("--rows", type=positive_int, default=1, help="sequences of the decode step (default 1; at most 16)")
    p.add_argument("--arch", default="sm_90a", choices=["sm_90a"], help="target: sm_90a (H100 / H200), the default")
    p.add_argument(
        "--gpu",
        default="h100",
        choices=["h100", "h200"],
        help="the device whose limits and SM count size grids and occupancy (default h100)",
    )
    p.add_argument("--no-megakernel", dest="megakernel", action="store_false", help="check the launchers only")
    p.add_argument(
        "--triton",
        action="append",
        default=[],
        metavar="DIR",
        help="also check with the Triton installed in DIR (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    p.set_defaults(run=run)


def run(args) -> int:
    from nonstop.runtime import gpucheck

    if args.rows > 16:
        raise ValueError("--rows: a decode step has at most 16 rows")
    for path in args.triton:
        if not os.path.isdir(os.path.join(path, "triton")):
            raise ValueError(f"--triton {path}: no triton package in that directory")
        gpucheck.triton_in(path)  # one that imports, before the compiles start
    if args.model is None:
        shapes = []
        for name, layers in gpucheck.PRESET_SHAPES.items():
            if args.num_layers:  # at most N layers of each preset shape (the default when N is larger)
                layers = min(args.num_layers, layers or gpucheck.config_of(name, None).num_hidden_layers)
            shapes.append((name, name, layers))
    else:
        gpucheck.config_of(args.model, args.num_layers)  # a clear error before the compiles start
        shapes = [(os.path.basename(os.path.normpath(args.model)), args.model, args.num_layers)]
    results, failures = [], []
    for triton_path in [None, *args.triton]:
        try:
            results.append(
                gpucheck.run_check(
                    shapes,
                    rows=args.rows,
                    arch=90,
                    megakernel=args.megakernel,
                    triton_path=triton_path,
                    progress=not args.quiet,
                    gpu=args.gpu,
                )
            )
        except RuntimeError as exc:  # a kernel that does not compile for sm_90a is a finding, not a crash
            where = f"the Triton in {triton_path}" if triton_path else "the installed Triton"
            failures.append(f"with {where}: {exc}")
            print(f"nonstop gpucheck: with {where}: {exc}", file=sys.stderr)
    bad = [v for r in results for row in r["rows"] for v in row["violations"]]
    if args.json:
        report = {"arch": args.arch, "gpu": args.gpu, "rows": args.rows, "results": results, "violations": bad}
        print(json.dumps({**report, "failures": failures}, indent=1))
    else:
        for r in results:
            print(gpucheck.table([gpucheck.Row(**row) for row in r["rows"]], r["triton"]))
            print()
        if failures:
            print(f"{len(failures)} check(s) failed to run (see above)")
        print(
            f"{len(bad)} violation(s)"
            if bad
            else "no violation: no spills, every kernel fits, every spin-wait acquires, "
            "every weight stream uses 16-byte loads"
        )
    return 1 if bad or failures else 0
