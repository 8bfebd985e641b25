"""Facts about the machine for benchmark and training reports (shared CPUs skew timings)."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def copy_bandwidth_gbps(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """This machine's memory bandwidth as torch sees it (current thread count): the best of ``repeats``
    copies of an ``nbytes`` fp32 buffer, counting bytes read + written, 2 · nbytes / time, in GB/s."""
    import time

    import torch

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best / 1e9


def decode_floor(bytes_per_token: int, copy_gbps: float) -> dict:
    """The bandwidth floor of batch-1 decoding: every active weight byte read once per token at the
    copy bandwidth, as {copy_GBps, bytes_per_token, floor_ms_per_token, floor_tokens_per_s}."""
    seconds = bytes_per_token / (copy_gbps * 1e9)
    return {"copy_GBps": round(copy_gbps, 2), "bytes_per_token": bytes_per_token, "floor_ms_per_token": round(seconds * 1e3, 3), "floor_tokens_per_s": round(1 / seconds, 1)}
