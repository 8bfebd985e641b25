"""The ``cpu`` executor's GEMV kernels in this tree against the same kernels at another git revision.

Both builds run in one process: the base revision's ``runtime/cpu/gemv.cpp`` (and ``isa.h``) is compiled
under the op namespace ``nonstop_base``, this tree's kernels are the ordinary ``nonstop_cpu`` ones. For
each weight shape [N, K] and each format (fp32, bf16, int8 with a scale per ``group_size(K)`` columns), a
set of distinct weights larger than the last-level cache is cycled so every product reads its weight from
memory, the two builds alternated rep by rep on the same packed weights and the same x [1, K] after one
warm-up pass of each (base first on even reps, this tree first on odd ones: neither always runs second, on
what the other left in the caches and clocks). Reported per format: GB/s of weight bytes read (best rep of
each), the median of the per-rep time ratios (base / this tree, > 1: this tree faster), the largest relative
difference of the two outputs (the builds must compute the same product), next to the copy bandwidth
measured in the same run.

    python bench/cpu_gemv_ab.py --base HEAD [--threads 2] [--reps 9] [--shapes 1280x768,24576x768]
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from cpu_gemv import weight_shapes  # bench/ is this script's folder, so on sys.path
from script_args import add_out_arg, positive_float, positive_int, run, thread_count

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SHAPES = "1280x768,768x768,2048x768,768x2048,24576x768,4099x1030"
SOURCES = ("nonstop/runtime/cpu/gemv.cpp", "nonstop/runtime/cpu/isa.h")


def build_base(rev: str) -> None:
    """Compile ``rev``'s GEMV kernels as the ``nonstop_base`` op library (exits with a message if it cannot)."""
    from torch.utils.cpp_extension import load

    tmp = Path(tempfile.mkdtemp(prefix="nonstop_gemv_base_"))
    atexit.register(shutil.rmtree, tmp, True)  # the loaded library stays mapped; its build files go at exit
    for path in SOURCES:
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True)
        if shown.returncode != 0:
            sys.exit(f"cannot read {path} at {rev}: {shown.stderr.strip()}")
        text = shown.stdout.replace("TORCH_LIBRARY(nonstop_cpu,", "TORCH_LIBRARY(nonstop_base,")
        text = text.replace("TORCH_LIBRARY_IMPL(nonstop_cpu,", "TORCH_LIBRARY_IMPL(nonstop_base,")
        (tmp / Path(path).name).write_text(text)
    print(f"building the GEMV kernels of {rev} ...", file=sys.stderr, flush=True)
    load(
        "nonstop_gemv_base",
        [str(tmp / "gemv.cpp")],
        extra_cflags=["-O3", "-fopenmp", f"-I{tmp}"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(tmp),
        is_python_module=False,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision whose kernels are the baseline (e.g. HEAD, main~1)")
    ap.add_argument("--threads", type=thread_count, default=2, help="torch threads of both builds (default 2)")
    ap.add_argument(
        "--reps", type=positive_int, default=9, help="timed passes of each build over the weights (default 9)"
    )
    ap.add_argument("--shapes", type=weight_shapes, default=DEFAULT_SHAPES, help="comma-separated NxK weight shapes")
    ap.add_argument(
        "--working-set", type=positive_float, default=None, help="MB of weights cycled (default: 96 or 2x LLC)"
    )
    add_out_arg(ap, "cpu_gemv_ab.json")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))

    from nonstop.hostinfo import copy_bandwidth, memory_sized_bytes, write_result
    from nonstop.runtime.cpu.kernels import load_kernels
    from nonstop.runtime.cpu.pack import bytes_per_weight, place_on_huge_pages
    from nonstop.runtime.cpu.packed import Bf16Weight, F32Weight, Int8Weight
    from nonstop.threads import set_threads
    from nonstop.weights.quant import group_size

    set_threads(args.threads)

    missing = load_kernels(progress=True)
    if missing:
        sys.exit(f"the C++ GEMV kernels are unavailable: {missing}")
    build_base(args.base)
    working_set = args.working_set or memory_sized_bytes(96 << 20) / 1e6
    load = [os.getloadavg()]
    copy = copy_bandwidth()["copy_GBps"]
    rows = []
    for N, K in args.shapes:
        g = torch.Generator().manual_seed(N * K)
        x = torch.randn(1, K, generator=g)
        group = group_size(K)
        formats = {  # name -> (pack format, packing, op name, the op's weight operands)
            "fp32": ("float32", lambda w: F32Weight(w, True), "linear_f32", lambda p: (p.w,)),
            "bf16": ("bfloat16", lambda w: Bf16Weight(w, True), "linear_bf16", lambda p: (p.w,)),
            "int8": (
                "int8",
                lambda w, group=group: Int8Weight(w, True, group=group),
                "linear_int8",
                lambda p: (p.q, p.s),
            ),
        }
        row = {"N": N, "K": K}
        for name, (fmt, pack, op, operands) in formats.items():
            nbytes = N * K * bytes_per_weight(fmt, group)
            count = max(2, int(working_set * 1e6 // nbytes))
            weights = [pack(torch.randn(N, K, generator=g)) for _ in range(count)]
            place_on_huge_pages(weights)
            ops = {
                side: getattr(getattr(torch.ops, lib), op)
                for side, lib in (("base", "nonstop_base"), ("this", "nonstop_cpu"))
            }
            outs = {side: f(x, *operands(weights[0]), N, False) for side, f in ops.items()}
            diff = ((outs["base"] - outs["this"]).abs().max() / outs["base"].abs().max()).item()
            for f in ops.values():  # warm-up: one pass of each build over the weights
                for p in weights:
                    f(x, *operands(p), N, False)
            times = {"base": [], "this": []}
            for rep in range(args.reps):
                for side in ("base", "this") if rep % 2 == 0 else ("this", "base"):
                    f = ops[side]
                    t0 = time.perf_counter()
                    for p in weights:
                        f(x, *operands(p), N, False)
                    times[side].append((time.perf_counter() - t0) / count)
            ratio = statistics.median(b / t for b, t in zip(times["base"], times["this"]))
            row[name] = {
                "base_GBps": round(nbytes / min(times["base"]) / 1e9, 2),
                "this_GBps": round(nbytes / min(times["this"]) / 1e9, 2),
                "paired_median_speedup": round(ratio, 3),
                "max_rel_diff": float(f"{diff:.2e}"),
            }
            del weights
        rows.append(row)
        print(
            f"{N:>5}x{K:<5} "
            + "  ".join(
                f"{n} {row[n]['base_GBps']:5.1f} -> {row[n]['this_GBps']:5.1f} GB/s "
                f"(x{row[n]['paired_median_speedup']:.3f}, diff {row[n]['max_rel_diff']:.0e})"
                for n in formats
            ),
            flush=True,
        )
    load.append(os.getloadavg())
    copy_after = copy_bandwidth()["copy_GBps"]
    write_result(
        args.out,
        "cpu_gemv_ab",
        {
            "base": subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", args.base], capture_output=True, text=True
            ).stdout.strip(),
            "threads": args.threads,
            "reps": args.reps,
            "copy_GBps": [round(copy, 2), round(copy_after, 2)],
            "load_average": [[round(v, 2) for v in la] for la in load],
            "rows": rows,
        },
    )
    print(f"copy bandwidth {copy:.1f} / {copy_after:.1f} GB/s; wrote {args.out}")


if __name__ == "__main__":
    run(main)
