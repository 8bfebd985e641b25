"""``die_with_parent``: a process started by a launcher ends when that launcher dies, however it dies.

A launcher killed with SIGKILL cannot stop its ranks; without this they would live on (a server's ranks
forever, a generation's until it ends). Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the kernel kill
the process the moment its parent ends (no thread, no polling). Elsewhere, or when prctl is refused: a
daemon thread polls ``os.getppid()`` every ``poll`` seconds and ends the process (``os._exit``) once the
parent is no longer the launcher (an orphan is re-parented to init or a subreaper).

The death signal is SIGKILL: with its launcher gone a rank has no one to report to and nothing to save;
its sockets close with it, so ranks on other hosts fail at once with the usual "another rank has died".
Linux sends the signal when the *thread* that started the process ends; ``spawn`` starts and joins its
ranks in the same thread, which lives as long as they do.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl_death_signal() -> bool:
    """Ask the kernel to SIGKILL this process when its parent ends; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(launcher: int, poll: float) -> None:
    while os.getppid() == launcher:
        time.sleep(poll)
    os._exit(1)


def die_with_parent(launcher: int, poll: float = 0.5, prctl: bool = True) -> str:
    """End this process when ``launcher`` (its parent's pid) dies; returns how: "prctl" or "watchdog".
    A launcher already gone by the time this runs ends the process at once. ``prctl=False`` forces the
    watchdog thread (the portable fallback; tests)."""
    how = "prctl" if prctl and _prctl_death_signal() else "watchdog"
    if os.getppid() != launcher:  # the launcher died before the death signal was armed
        os._exit(1)
    if how == "watchdog":
        threading.Thread(target=_watch, args=(launcher, poll), name="nonstop-parent-watch", daemon=True).start()
    return how
