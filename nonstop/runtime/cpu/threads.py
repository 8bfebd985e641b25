"""The CPU executor's default thread count: one per physical core this process may run on.

Hyper-threads share a core's load/store units, and decode is bound by reading weights, so a second
thread per core adds synchronisation, not bandwidth. An explicit choice always wins: ``NONSTOP_THREADS``,
else ``OMP_NUM_THREADS`` (which torch already honours), else this default.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


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


def default_threads() -> int:
    for var in ("NONSTOP_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return physical_cores()


def configure_threads(threads: int | None = None) -> int:
    """Set torch's intra-op threads to ``threads`` (or ``default_threads()``); returns the count."""
    n = threads if threads else default_threads()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
