"""Processes of the multi-process CLI tests, never left behind.

``launched(argv)`` starts ``python argv...`` in its own session (so its process group holds the launcher
and the ranks it spawns) and, on leaving - normally, on a failed assert, on a ``communicate`` timeout -
SIGKILLs that group and every descendant it has seen (torchrun starts each worker in a session of its
own), then reaps the launcher. ``rank_pids`` / ``wait_started`` find the ranks of a launcher.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/pid/stat after the command name (state, ppid, pgrp, ...); None once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Running (a zombie has exited: only its exit status is left)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            fields = _stat(int(d.name))
            if fields is not None and int(fields[1]) == pid:
                out.append(int(d.name))
    return out


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def rank_pids(pid: int) -> list[int]:
    """The rank processes the launcher ``pid`` started (not multiprocessing's resource tracker)."""
    ranks = []
    for c in children(pid):
        try:
            cmd = Path(f"/proc/{c}/cmdline").read_bytes()
        except OSError:
            continue
        if b"resource_tracker" not in cmd:
            ranks.append(c)
    return sorted(ranks)


class Launched(subprocess.Popen):
    """A Popen that remembers every descendant it was asked about (``seen``), for ``kill_tree``."""

    seen: set[int]

    def ranks(self) -> list[int]:
        self.seen.update(descendants(self.pid))
        return rank_pids(self.pid)


def kill_tree(proc: Launched) -> None:
    """SIGKILL the launcher's process group and every descendant seen or still attached, then reap it."""
    mine = os.getpgrp()
    pids = {*proc.seen, *descendants(proc.pid)}
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group id is its pid, even once it is reaped
    for pid in sorted(pids):
        with contextlib.suppress(OSError):
            group = os.getpgid(pid)
            if group != mine:
                os.killpg(group, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError, subprocess.TimeoutExpired, ValueError):
        proc.communicate(timeout=10)


@contextlib.contextmanager
def launched(argv: list[str], **popen_kw) -> Iterator[Launched]:
    """``python argv...`` from the repository root, text pipes, its own session; its tree killed on exit."""
    kw = {"cwd": ROOT, "env": ENV, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = Launched([sys.executable, *argv], start_new_session=True, **{**kw, **popen_kw})
    proc.seen = set()
    try:
        yield proc
    finally:
        kill_tree(proc)


def wait_started(proc: Launched, n: int, deadline: float = 180) -> list[int]:
    """The launcher's ``n`` ranks, once rank 0 has written to stdout (it has loaded the model and started
    the command: ``generate`` echoes its prompt). Not a fixed wait: on a busy host the ranks can still be
    starting many seconds in, where a signal tests another path."""
    import select

    end = time.monotonic() + deadline
    while not select.select([proc.stdout], [], [], 0.2)[0]:
        assert proc.poll() is None, f"the launcher ended early: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < end, "rank 0 never started its command"
    ranks = proc.ranks()
    assert len(ranks) == n, ranks
    return ranks


def gone_within(pids: list[int], seconds: float) -> list[int]:
    """Waits up to ``seconds`` for every pid to end; the pids still running then."""
    end = time.monotonic() + seconds
    while [p for p in pids if alive(p)] and time.monotonic() < end:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]
