"""A process stopped by the user: Ctrl-C (``KeyboardInterrupt``) or SIGTERM (``Terminated``, raised where
a handler turns the signal into an exception: a launched rank 0, a checkpoint write), and the one line
and exit status each ends with."""

from __future__ import annotations

import contextlib
import sys


class Terminated(BaseException):
    """SIGTERM, raised as Ctrl-C raises KeyboardInterrupt: the process says "terminated" and exits 143 (in a
    launch's rank 0; in the launcher, every rank had to be stopped after a SIGTERM; during a checkpoint
    write, once the write's staging directory is removed)."""


def stop_status(exc: BaseException) -> tuple[str, int]:
    """What a process stopped by ``exc`` (KeyboardInterrupt or ``Terminated``) says and exits with, as a
    shell reports a signal: ("interrupted", 130) or ("terminated", 143)."""
    return ("interrupted", 130) if isinstance(exc, KeyboardInterrupt) else ("terminated", 143)


def stop_behind(exc: BaseException) -> BaseException | None:
    """The stop (KeyboardInterrupt or ``Terminated``) that ``exc`` is, or that was unwinding when ``exc`` was
    raised (its ``__context__`` chain), else None. An error a stop causes on its way out - a context
    manager's exit failing as Ctrl-C cuts through it, as torch's mode stack does ("trying to pop from empty
    mode stack") - is the stop's, not a bug of its own."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (KeyboardInterrupt, Terminated)):
            return exc
        seen.add(id(exc))
        exc = exc.__context__
    return None


def print_line(line: str) -> None:
    """``line`` on stderr in one write, flushed: the ranks of a launch share stderr, and ``print`` writes
    the text and its newline apart (two ranks' lines were seen run together on one line)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
