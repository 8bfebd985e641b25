"""Preflight: refuse, before allocating anything, work this machine cannot hold.

``check_memory`` compares what a loaded model occupies (weights at the chosen dtype from
``model_footprint``, the cost model's view, plus every slot's recurrent state and its attention cache for
``cache_tokens`` tokens) with the memory free on the device: ``MemAvailable`` (bounded by the cgroup limit, in a
container) on a CPU, ``cudaMemGetInfo`` on a GPU. ``check_disk`` compares a checkpoint's size with the
free space of the file system it goes to. Both raise ``PreflightError`` with one line such as
"kimi-k3 needs 1.56 TB at bfloat16; this machine has 23 GB free". A multi-rank layout adds up its ranks'
parts (``engine/layout_preflight.py``) and refuses through the same ``refuse_if_short``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from nonstop.config import ModelConfig
from nonstop.program.footprint import Footprint, model_footprint
from nonstop.weights.resolve import DTYPE_NAMES

CACHE_TOKENS_PER_SLOT = 1024  # attention cache counted per slot (it grows by pages as sequences grow)
OVERRIDE_HINT = "pass --no-preflight to try anyway"
LOAD_OVERRIDE_HINT = f"{OVERRIDE_HINT}; from Python, LLM(..., preflight=False)"  # a model's load: CLI or API


class PreflightError(ValueError):
    """The machine lacks the memory or disk space the work needs."""


def three_digits(n: float, prefixes: tuple[str, ...]) -> tuple[str, str]:
    """``n`` scaled by the power of 1000 that keeps it under 1000 once rounded to 3 significant digits, as
    (its digits, that power's prefix): 999_700 with ("", "K", "M") is ("1", "M"), not 1e+03 K. Past the last
    prefix the digits are a whole number (12000 TB, never 1.2e+04 TB)."""
    for prefix in prefixes[:-1]:
        if abs(float(f"{n:.3g}")) < 1000:
            return f"{n:.3g}", prefix
        n /= 1000
    return (f"{n:.3g}" if abs(float(f"{n:.3g}")) < 1000 else f"{n:.0f}"), prefixes[-1]


def size_text(n: float) -> str:
    """Bytes in decimal units with three digits: 1.56 TB, 23 GB, 512 MB."""
    digits, unit = three_digits(n, ("B", "KB", "MB", "GB", "TB", "PB"))
    return f"{digits} {unit}"


def _cgroup_free() -> int | None:
    """Bytes left under this process's cgroup v2 / v1 memory limit (None when unlimited or unknown)."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            return max(0, int(limit) - usage)
    return None


def allocation_failed(exc: BaseException) -> bool:
    """``exc`` is an allocation failure: Python's MemoryError, torch's OutOfMemoryError (CUDA) or the
    RuntimeError of torch's CPU allocator ("DefaultCPUAllocator: can't allocate memory ...")."""
    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(exc)


def available_memory(device: torch.device) -> int:
    """Bytes free for a model on ``device`` now."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cgroup = _cgroup_free()
    return min(free, cgroup) if cgroup is not None else free


def footprint_bytes(
    fp: Footprint, max_positions: int, slots: int = 1, cache_tokens: int = CACHE_TOKENS_PER_SLOT
) -> tuple[int, int]:
    """(weight bytes, cache bytes for ``slots`` sequences of ``cache_tokens`` tokens, at most
    ``max_positions``) of a model (or a rank's part of one) with footprint ``fp``."""
    tokens = min(cache_tokens, max_positions)
    return fp.weight_bytes, slots * (fp.state_bytes_per_sequence + tokens * fp.cache_bytes_per_token)


def model_bytes(
    cfg: ModelConfig, dtype: torch.dtype, slots: int = 1, cache_tokens: int = CACHE_TOKENS_PER_SLOT
) -> tuple[int, int]:
    """(weight bytes at ``dtype``, cache bytes for ``slots`` sequences of ``cache_tokens`` tokens)."""
    return footprint_bytes(model_footprint(cfg, dtype), cfg.max_position_embeddings, slots, cache_tokens)


def memory_place(device: torch.device) -> str:
    """How a refusal names the memory of ``device``: "this machine" (host memory) or e.g. "cuda:1"."""
    return "this machine" if device.type == "cpu" else f"{device}"


def refuse_if_short(what: str, weights: int, cache: int, dtype: torch.dtype, slots: int, where: str, free: int) -> None:
    """PreflightError, one line, when ``what`` (weights + cache of ``slots`` sequences) exceeds the ``free``
    bytes of ``where``."""
    if weights + cache > free:
        raise PreflightError(
            f"{what} needs {size_text(weights + cache)} at {DTYPE_NAMES.get(dtype, dtype)} "
            f"({size_text(weights)} of weights, {size_text(cache)} of cache for {slots} "
            f"sequence(s)); {where} has {size_text(free)} free ({LOAD_OVERRIDE_HINT})"
        )


def check_memory(
    name: str, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, slots: int = 1, free: int | None = None
) -> None:
    """PreflightError when weights + cache of ``slots`` sequences exceed the free memory of ``device``."""
    weights, cache = model_bytes(cfg, dtype, slots)
    free = available_memory(device) if free is None else free
    refuse_if_short(name, weights, cache, dtype, slots, memory_place(device), free)


def free_disk(path: Path) -> int:
    """Free bytes on the file system that ``path`` (or its nearest existing parent) is on."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def check_disk(what: str, nbytes: int, out: Path, free: int | None = None) -> None:
    """PreflightError when writing ``nbytes`` into ``out`` would not fit its file system."""
    free = free_disk(out) if free is None else free
    if nbytes > free:
        raise PreflightError(
            f"{what} needs {size_text(nbytes)} of disk; {out} has {size_text(free)} free ({OVERRIDE_HINT})"
        )
