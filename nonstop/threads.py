"""How many CPU threads torch computes with: one module for ``--threads`` and the default.

An explicit choice always wins: ``set_threads(n)`` (every command's ``--threads``), else
``NONSTOP_THREADS``, else ``OMP_NUM_THREADS``. Otherwise (``default_threads``) a model that reads at
least ``SMALL_MODEL_BYTES`` of weights per token gets one thread per physical core this process may run
on (hyper-threads share a core's load/store units: a second thread per core adds synchronisation, not
bandwidth). A tinier one (the test suite's configs: 0.2-0.5 MB) gets one thread: its products are
smaller than the GEMV kernels' 64 KB task grain, so a second thread only adds a handshake to each
parallel region. Measured on 2 cores, interleaved, ``cpu`` backend, batch 1: k3-nano (29 MB per token)
decodes 16-19% faster at 2 threads than at 1 (Xeon with AVX-512: 728 vs 625 tok/s median; EPYC: 794 vs
721 best round), the tiny kimi_k3 config (0.5 MB) 2% slower (2,060 vs 2,161).
"""

from __future__ import annotations

import os
from pathlib import Path

SMALL_MODEL_BYTES = 4 << 20
_chosen: int | None = None  # set_threads' explicit choice


def set_threads(n: int | None) -> int:
    """Use ``n`` intra-op CPU threads (None: keep the current setting) and remember it as the user's
    choice, which ``default_threads`` then returns; returns the count in effect."""
    global _chosen
    import torch

    if n is not None:
        if n < 1:
            raise ValueError(f"threads must be >= 1, got {n}")
        torch.set_num_threads(n)
        _chosen = n
    return torch.get_num_threads()


def physical_cores() -> int:
    """Distinct physical cores among the CPUs this process may run on (Linux sysfs; else os.cpu_count)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            cores.add(siblings.read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


def default_threads(bytes_per_token: int | None = None) -> int:
    """The explicit choice if there is one, else the rule above for a model reading ``bytes_per_token``."""
    if _chosen is not None:
        return _chosen
    for var in ("NONSTOP_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    if bytes_per_token is not None and bytes_per_token < SMALL_MODEL_BYTES:
        return 1
    return physical_cores()


def configure_threads(threads: int | None = None, bytes_per_token: int | None = None) -> int:
    """Set torch's intra-op threads to ``threads`` (or ``default_threads(bytes_per_token)``); returns the count."""
    import torch

    n = threads if threads else default_threads(bytes_per_token)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
