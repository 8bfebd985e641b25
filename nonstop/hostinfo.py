"""The machine a measurement ran on, and how benchmarks time and find the bandwidth floor.

One helper for every script in ``bench/`` (and the training report):

  environment(device)         machine and versions for a results JSON: Python, torch (+ CUDA), triton,
                              transformers, host, CPU model, cores, torch threads, load average (shared
                              CPUs skew timings); on CUDA the GPU name, memory, SMs, capability, driver
  Clock(device)               ``time_steps(step, steps, warmup)``: per-call milliseconds (CUDA events on a
                              GPU, ``perf_counter`` after a sync elsewhere): median, p10, p90, fastest
  timed(fn)                   seconds one call of ``fn`` takes (wall clock)
  copy_bandwidth(device, ...) a device-to-device copy's GB/s counting bytes read + written (the floor's
                              bandwidth), and a read-only sum's; on a CPU the buffers outgrow the last-level
                              cache (``last_level_cache_bytes``), so the figure is the memory's, not the cache's
  decode_floor(bytes, GB/s)   batch-1 decode floor: every active weight byte read once per token
  command_line()              the exact command, for the results JSON
  write_result(out, name, fields) a results JSON: the benchmark's name, command and environment, then fields
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch


def _cpuinfo_field(name: str) -> str | None:
    """The first ``name : value`` of /proc/cpuinfo (Linux), else None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == name:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` knows."""
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def cpu_vendor() -> str:
    """The CPU's vendor id from /proc/cpuinfo (``GenuineIntel``, ``AuthenticAMD``, ...), "" when it does not say."""
    return _cpuinfo_field("vendor_id") or ""


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpu(device: torch.device) -> dict:
    props = torch.cuda.get_device_properties(device)
    info = {
        "gpu": props.name,
        "gpu_memory_GiB": round(props.total_memory / 2**30, 1),
        "sms": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "driver": None,
    }
    try:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        info["driver"] = (
            subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        )
    except (OSError, IndexError, subprocess.SubprocessError):
        pass
    return info


def cuda_missing(device: str, ranks: int = 1, cpu_hint: str = "--device cpu") -> str | None:
    """Why a benchmark cannot run on ``device`` with ``ranks`` GPUs here (None when it can): the one-line
    reason a script passes to ``ArgumentParser.error``, naming ``cpu_hint`` as the way to run on this CPU."""
    if not str(device).startswith("cuda"):
        return None
    if not torch.cuda.is_available():
        return f"no CUDA device here (this torch {torch.__version__} sees none): use {cpu_hint}"
    if torch.cuda.device_count() < ranks:
        return f"{ranks} ranks need {ranks} GPUs, this machine has {torch.cuda.device_count()}"
    return None


def environment(device="cpu") -> dict:
    """Machine and versions for a results JSON (see the module docstring); ``gpu`` is None off CUDA."""
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "last_level_cache_MB": round(last_level_cache_bytes() / 2**20, 1),
        "threads": torch.get_num_threads(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "gpu": None,
    }
    device = torch.device(device)
    if device.type == "cuda":
        info.update(_gpu(device))
    return info


def command_line() -> str:
    """This process's command, as one shell-quoted line."""
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])


def write_result(out, benchmark: str, fields: dict, indent: int = 1) -> dict:
    """Write ``{"benchmark", "command", "environment", **fields}`` as JSON to ``out`` (folders made); returns it."""
    result = {"benchmark": benchmark, "command": command_line(), "environment": environment(), **fields}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=indent) + "\n")
    return result


def timed(fn) -> float:
    """Seconds one call of ``fn()`` takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Clock:
    """Per-call timing of a step: CUDA events on a GPU, ``perf_counter`` after a sync elsewhere."""

    def __init__(self, device="cpu"):
        self.cuda = torch.device(device).type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time_steps(self, step, steps: int, warmup: int) -> dict:
        """Run ``step()`` ``warmup`` times, then time ``steps`` calls: {ms_per_token (median), p10_ms,
        p90_ms, min_ms, loop_ms_per_step (the whole loop / steps), steps, warmup}."""
        for _ in range(warmup):
            step()
        self.sync()
        if self.cuda:
            marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
            loop = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            loop[0].record()
            for start, end in marks:
                start.record()
                step()
                end.record()
            loop[1].record()
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in marks]
            loop_ms = loop[0].elapsed_time(loop[1])
        else:
            times = []
            t_loop = time.perf_counter()
            for _ in range(steps):
                times.append(timed(step) * 1e3)
            loop_ms = (time.perf_counter() - t_loop) * 1e3
        times.sort()
        return {
            "ms_per_token": statistics.median(times),
            "p10_ms": nearest_rank(times, 0.1),
            "p90_ms": nearest_rank(times, 0.9),
            "min_ms": times[0],
            "loop_ms_per_step": loop_ms / steps,
            "steps": steps,
            "warmup": warmup,
        }


def nearest_rank(ordered: list[float], f: float) -> float:
    """The f-quantile of ``ordered`` (sorted, not empty) by nearest rank: its ceil(f·n)-th smallest value
    (the p90 of 10 timings is the 9th, not the slowest; the p10 the 1st)."""
    return ordered[min(len(ordered), max(1, math.ceil(f * len(ordered)))) - 1]


def last_level_cache_bytes() -> int:
    """The CPU's largest cache in bytes (sysconf, else /sys's cache index), 0 when neither says."""
    for name in ("SC_LEVEL4_CACHE_SIZE", "SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            size = os.sysconf(name)
        except (ValueError, OSError):
            continue
        if size and size > 0:
            return int(size)
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=0)


def memory_sized_bytes(minimum: int = 256 << 20) -> int:
    """A CPU buffer size that no cache holds: ``minimum`` or twice the last-level cache, the larger
    (a machine with a 480 MiB L3 would otherwise time its cache, not its memory)."""
    return max(minimum, 2 * last_level_cache_bytes())


def copy_bandwidth(device="cpu", nbytes: int | None = None, reps: int = 10) -> dict:
    """Median GB/s of a device-to-device copy of ``nbytes`` (bytes read + written: 2·nbytes / time) and of
    a read-only sum of the same bytes as bf16 (nbytes / time), at the current torch thread count.
    ``nbytes`` defaults to 256 MiB, on a CPU at least twice its last-level cache (``memory_sized_bytes``)."""
    if nbytes is None:
        nbytes = memory_sized_bytes() if torch.device(device).type == "cpu" else 256 << 20
    clock = Clock(device)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_ms = clock.time_steps(lambda: dst.copy_(src), reps, 3)["ms_per_token"]
    as_bf16 = src.view(torch.bfloat16) if nbytes % 2 == 0 else src.float()
    read_ms = clock.time_steps(lambda: as_bf16.sum(dtype=torch.float32), reps, 3)["ms_per_token"]
    return {"bytes": nbytes, "copy_GBps": 2 * nbytes / copy_ms / 1e6, "read_sum_GBps": nbytes / read_ms / 1e6}


def decode_floor(bytes_per_token: int, copy_gbps: float) -> dict:
    """The bandwidth floor of batch-1 decoding: every active weight byte read once per token at the
    copy bandwidth, as {copy_GBps, bytes_per_token, floor_ms_per_token, floor_tokens_per_s}; the milliseconds
    to 3 decimals, under 1 ms to 4 significant digits (a small model on a fast device floors under 1 us)."""
    seconds = bytes_per_token / (copy_gbps * 1e9)
    ms = seconds * 1e3
    return {
        "copy_GBps": round(copy_gbps, 2),
        "bytes_per_token": bytes_per_token,
        "floor_ms_per_token": round(ms, 3) if ms >= 1 else float(f"{ms:.4g}"),
        "floor_tokens_per_s": round(1 / seconds, 1),
    }
