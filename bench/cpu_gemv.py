"""One-row weight products on the CPU: the ``cpu`` executor's tiled GEMV kernels against torch's.

For each weight shape [N, K] (by default the shapes of k3-nano's and a 246M Llama's decode steps), each
format cycles distinct weights that fill --working-set MB in its own bytes (by default 96 MB or twice the
last-level cache, the larger; so int8 cycles about four times as many matrices as fp32), so every product
reads its weight from memory, as a decode step does; a smaller --working-set is warned about (its products
may read the cache instead). Timed per product, x [1, K] fp32:
  torch fp32            ``x @ Wᵀ`` on the plain matrix (BLAS)
  tiled fp32 4K pages   ``linear_f32`` on the row tiles (``runtime/cpu/packed.F32Weight``), ordinary pages
  tiled fp32            the same tiles on huge pages, as the executor places them (``pack.place_on_huge_pages``)
  tiled bf16            ``linear_bf16`` (16-bit weights widened in registers), huge pages
  tiled int8            ``linear_int8`` (8-bit weights, one fp32 scale per 128 columns), huge pages
each as µs per product and GB/s of weight bytes read, next to the copy bandwidth measured in the same
run (``hostinfo.copy_bandwidth``, bytes read + written; its buffers outgrow the last-level cache). Writes
bench/results/cpu_gemv.json.

    python bench/cpu_gemv.py [--threads 1] [--working-set 96] [--reps 5] [--shapes 1024x256,2048x2048]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path

import torch
from script_args import add_out_arg, positive_float, positive_int, run, thread_count

DEFAULT_SHAPES = "128x256,548x256,1024x256,256x768,6144x256,2048x2048,5632x2048,2048x5632"


def weight_shapes(text: str) -> list[tuple[int, int]]:
    """``--shapes``: "N1xK1,N2xK2" -> [(N1, K1), (N2, K2)], each a positive weight shape [N, K]."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not a weight shape NxK (e.g. 2048x768)")
        shapes.append((int(parts[0]), int(parts[1])))
    return shapes


def _packed_linear(x: torch.Tensor, w) -> torch.Tensor:
    return w.linear(x)


def cache_warning(working_set_mb: float, cache_bytes: int) -> str | None:
    """The warning for a working set under twice the last-level cache of ``cache_bytes`` (0: unknown, none)."""
    if not cache_bytes or working_set_mb * 1e6 >= 2 * cache_bytes:
        return None
    return (
        f"warning: --working-set {working_set_mb:g} MB is under twice the last-level cache ({cache_bytes / 1e6:.1f} "
        "MB): the products may read their weights from the cache, not from memory"
    )


def time_products(calls: list, reps: int) -> float:
    """Microseconds per call, each of ``calls`` run once per rep after one warm-up pass."""
    for call in calls:
        call()
    t0 = time.perf_counter()
    for _ in range(reps):
        for call in calls:
            call()
    return (time.perf_counter() - t0) / (reps * len(calls)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=thread_count, default=1, help="torch threads of every product (default 1)")
    ap.add_argument(
        "--working-set",
        type=positive_float,
        default=None,
        help="MB (1e6 bytes) of weights each format cycles per shape, in its own bytes (default: 96 MB or twice the "
        "last-level cache, the larger; less than twice the cache is warned about)",
    )
    ap.add_argument(
        "--reps", type=positive_int, default=5, help="timed passes over the weights, after one warm-up (default 5)"
    )
    ap.add_argument("--shapes", type=weight_shapes, default=DEFAULT_SHAPES, help="comma-separated NxK weight shapes")
    add_out_arg(ap, "cpu_gemv.json")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

    from nonstop.hostinfo import copy_bandwidth, last_level_cache_bytes, memory_sized_bytes, write_result
    from nonstop.runtime.cpu.kernels import load_kernels
    from nonstop.runtime.cpu.pack import bytes_per_weight, place_on_huge_pages
    from nonstop.runtime.cpu.packed import Bf16Weight, F32Weight, Int8Weight
    from nonstop.threads import set_threads
    from nonstop.weights.quant import group_size

    set_threads(args.threads)

    if args.working_set is None:
        args.working_set = memory_sized_bytes(96 * 10**6) / 1e6
    elif warning := cache_warning(args.working_set, last_level_cache_bytes()):
        print(warning, file=sys.stderr, flush=True)
    missing = load_kernels(progress=True)
    if missing:
        sys.exit(f"the C++ GEMV kernels are unavailable: {missing}")
    load = [os.getloadavg()]
    copy = copy_bandwidth()["copy_GBps"]
    rows = []
    for N, K in args.shapes:
        g = torch.Generator().manual_seed(N * K)
        x = torch.randn(1, K, generator=g)
        row = {"N": N, "K": K}
        group = group_size(K)
        formats = {  # name -> (bytes per weight, the weight as its product takes it, on huge pages)
            "torch fp32": (4.0, lambda w: w.t(), False),
            "tiled fp32 4K pages": (bytes_per_weight("float32"), lambda w: F32Weight(w, True), False),
            "tiled fp32": (bytes_per_weight("float32"), lambda w: F32Weight(w, True), True),
            "tiled bf16": (bytes_per_weight("bfloat16"), lambda w: Bf16Weight(w, True), True),
            "tiled int8": (bytes_per_weight("int8", group), partial(Int8Weight, kernels=True, group=group), True),
        }
        for name, (weight_bytes, pack, huge) in formats.items():
            count = max(1, int(args.working_set * 1e6 // (N * K * weight_bytes)))  # the working set in its bytes
            weights = [pack(torch.randn(N, K, generator=g)) for _ in range(count)]  # one fp32 source at a time
            if huge:  # as the cpu executor places them (runtime/cpu/pack.py)
                place_on_huge_pages(weights)
            calls = [partial(torch.matmul if name == "torch fp32" else _packed_linear, x, w) for w in weights]
            us = time_products(calls, args.reps)
            row[name] = {"us": round(us, 2), "GBps": round(N * K * weight_bytes / us / 1e3, 2), "weights_cycled": count}
            del weights, calls  # free this format's copies before the next
        rows.append(row)
        print(
            f"{N:>5}x{K:<5} "
            + "  ".join(f"{name} {row[name]['us']:8.1f} us {row[name]['GBps']:5.1f} GB/s" for name in formats),
            flush=True,
        )
    load.append(os.getloadavg())
    copy_after = copy_bandwidth()["copy_GBps"]
    write_result(
        args.out,
        "cpu_gemv",
        {
            "threads": args.threads,
            "working_set_MB": args.working_set,
            "copy_GBps": [round(copy, 2), round(copy_after, 2)],
            "load_average": [[round(v, 2) for v in la] for la in load],
            "rows": rows,
        },
    )
    print(f"copy bandwidth {copy:.1f} / {copy_after:.1f} GB/s; wrote {args.out}")


if __name__ == "__main__":
    run(main)
