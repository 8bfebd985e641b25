"""How many CPU threads torch computes with: one module for ``--threads`` and the default.

An explicit choice always wins: ``set_threads(n)`` (every command's ``--threads``), else
``NONSTOP_THREADS``, else ``OMP_NUM_THREADS`` (at most ``THREADS_PER_CPU_LIMIT`` per logical CPU: far more
threads than CPUs is a typo, and torch crashes at 10,000). Otherwise (``default_threads``) a model that reads at
least ``SMALL_MODEL_BYTES`` of weights per token gets one thread per physical core this process may run
on (hyper-threads share a core's load/store units: a second thread per core adds synchronisation, not
bandwidth). A tinier one (the test suite's configs: 0.2-0.5 MB) gets one thread: its products are
smaller than the GEMV kernels' 64 KB task grain, so a second thread only adds a handshake to each
parallel region. Measured on 2 cores, interleaved, ``cpu`` backend, batch 1: k3-nano (21.7 MB of fp32 weights per token)
decodes 16-19% faster at 2 threads than at 1 (Xeon with AVX-512: 728 vs 625 tok/s median; EPYC: 794 vs
721 best round), the tiny kimi_k3 config (0.5 MB) 2% slower (2,060 vs 2,161).

Cores other processes keep busy are left to them (``busy_elsewhere``: /proc/stat over ``LOAD_SAMPLE_S``, less
this process's own CPU time): the step's parallel regions need every one of its threads scheduled at once, so a
thread that shares its core with another busy process stalls each region until the scheduler returns it. On a
2-core Xeon VM with one other process spinning, k3-nano decoded 109 tok/s (median; best 194) on both cores
against 619 with the default's one thread, and 749 vs 729 quiet, where the default keeps both
(``bench/cpu_busy.py``, bench/results/cpu_busy.json); beside the test suite, 5-46 against 615-625. The sample
costs ``LOAD_SAMPLE_S`` once per executor, for models past ``SMALL_MODEL_BYTES`` on more than one core.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from pathlib import Path

SMALL_MODEL_BYTES = 4 << 20
LOAD_SAMPLE_S = 0.15  # how long busy_elsewhere watches the CPUs
BUSY_SLACK = 0.3  # other processes take a core once they keep 1 - BUSY_SLACK of one busy
_chosen: int | None = None  # set_threads' explicit choice
THREADS_PER_CPU_LIMIT = 8  # more threads than this per logical CPU is a typo, not a setting (10,000 crash torch)


def thread_limit() -> int:
    """The most threads nonstop accepts: THREADS_PER_CPU_LIMIT per logical CPU this process may run on."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return THREADS_PER_CPU_LIMIT * cpus


def check_thread_count(n: int, what: str = "--threads") -> int:
    """``n`` if it is a usable thread count, else a ValueError naming ``what``."""
    if n < 1:
        raise ValueError(f"{what} must be >= 1, got {n}")
    if n > thread_limit():
        raise ValueError(
            f"{what} {n} is more than {THREADS_PER_CPU_LIMIT} threads for each of this machine's "
            f"{thread_limit() // THREADS_PER_CPU_LIMIT} CPUs"
        )
    return n


def set_threads(n: int | None) -> int:
    """Use ``n`` intra-op CPU threads (None: keep the current setting) and remember it as the user's
    choice, which ``default_threads`` then returns; returns the count in effect."""
    global _chosen
    import torch

    if n is not None:
        torch.set_num_threads(check_thread_count(n, "threads"))
        _chosen = n
    return torch.get_num_threads()


@contextlib.contextmanager
def one_thread():
    """torch computes on one intra-op thread inside the block, then on as many as before. For work made
    of tiny ops whose count, not speed, is wanted (``program/count.py`` counting a narrow twin's aten ops):
    a second thread only adds its wake-up to each op, and on a busy 2-core host it made K3's count 12x
    slower (40 s against 3.2 s)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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


def _cpu_jiffies(cpus: set[int]) -> tuple[int, int] | None:
    """(busy, total) clock ticks of ``cpus`` since boot from /proc/stat's per-CPU lines, None where unreadable.
    Busy: user, nice, system, irq, softirq and steal (time a VM's CPU ran someone else); idle and iowait are free."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    busy = total = 0
    for line in lines:
        name, *fields = line.split() or [""]
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        ticks = [int(f) for f in fields[:8]]
        busy += sum(ticks) - ticks[3] - ticks[4]
        total += sum(ticks)
    return (busy, total) if total else None


def busy_elsewhere(seconds: float = LOAD_SAMPLE_S) -> float:
    """Cores' worth of CPU time that other processes used on the CPUs this process may run on, watched for
    ``seconds`` (Linux /proc/stat, less this process's own CPU time over the same window); 0.0 where unknown."""
    try:
        cpus = set(os.sched_getaffinity(0))
    except AttributeError:
        return 0.0
    before, own = _cpu_jiffies(cpus), time.process_time()
    time.sleep(seconds)
    after, own = _cpu_jiffies(cpus), time.process_time() - own
    if before is None or after is None or after[1] <= before[1]:
        return 0.0
    share = (after[0] - before[0]) / (after[1] - before[1])  # of all the CPUs' time in the window
    return max(0.0, share * len(cpus) - own / seconds)


def cores_left(cores: int, busy: float, logical: int | None = None) -> int:
    """Physical ``cores`` less those other processes keep busy (``busy`` logical CPUs' worth, of ``logical``
    CPUs in all; a core counts as taken from ``1 - BUSY_SLACK`` of it on), at least 1."""
    taken = math.floor(busy * cores / (logical or cores) + BUSY_SLACK)
    return max(1, cores - taken)


def _default(bytes_per_token: int | None) -> tuple[int, str | None]:
    """(default_threads' count, why it is below the physical cores because of other processes, or None)."""
    if _chosen is not None:
        return _chosen, None
    own = os.environ.get("NONSTOP_THREADS", "").strip()
    if own:  # nonstop's own setting: a bad value is an error, not silently ignored
        if not own.isdigit():
            raise ValueError(f"NONSTOP_THREADS must be a positive integer, got {own!r}")
        return check_thread_count(int(own), "NONSTOP_THREADS"), None
    value = os.environ.get("OMP_NUM_THREADS", "")  # OpenMP's (it may be a nested list like "4,2": not ours)
    if value.isdigit() and 0 < int(value) <= thread_limit():
        return int(value), None
    if bytes_per_token is not None and bytes_per_token < SMALL_MODEL_BYTES:
        return 1, None
    cores = physical_cores()
    if cores == 1:
        return 1, None
    busy = busy_elsewhere()
    n = cores_left(cores, busy, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores)
    why = f"other processes keep {busy:.1f} CPUs busy: {n} thread(s) for {cores} cores" if n < cores else None
    return n, why


def default_threads(bytes_per_token: int | None = None) -> int:
    """The explicit choice if there is one, else the rules above for a model reading ``bytes_per_token``."""
    return _default(bytes_per_token)[0]


def configure_threads(threads: int | None = None, bytes_per_token: int | None = None, announce: bool = False) -> int:
    """Set torch's intra-op threads to ``threads`` (or ``default_threads(bytes_per_token)``); returns the count.
    announce: say on stderr when other processes' load lowered the default."""
    import torch

    n, why = (threads, None) if threads else _default(bytes_per_token)
    if why and announce:
        choose = "--threads N, LLM(threads=N) or NONSTOP_THREADS=N to choose"
        print(f"nonstop: {why} ({choose})", file=sys.stderr, flush=True)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
