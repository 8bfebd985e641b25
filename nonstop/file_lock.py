"""``exclusive(path)``: an advisory lock between processes (``flock`` on ``path``, created if missing).

The kernel holds it for the open file, so a process that dies (killed, crashed) releases it at once: no
stale lock is ever left behind, unlike a lock *file* whose existence is the lock (torch's ``FileBaton``).
"""

from __future__ import annotations

import contextlib
import fcntl
import sys
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive(path: Path, waiting: str | None = None) -> Iterator[None]:
    """Hold the lock on ``path`` for the block; ``waiting``: a line printed on stderr when another process
    holds it (what this one waits for)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            t0 = time.perf_counter()
            if waiting:
                print(f"{waiting} ...", file=sys.stderr, flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
            if waiting:
                print(f"{waiting}: done after {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
