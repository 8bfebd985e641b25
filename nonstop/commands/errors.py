"""Turn the errors a user can fix into one clear line on stderr (exit status 2), never a traceback.

Anything else is a bug in nonstop: one line saying so (exit status 1); NONSTOP_DEBUG=1 shows the traceback.
"""

from __future__ import annotations

import contextlib
import os
import sys

from nonstop.config import ConfigError
from nonstop.stops import Terminated, print_line, stop_behind, stop_status
from nonstop.weights.errors import CheckpointError

USER_ERRORS = (
    ConfigError,
    CheckpointError,
    ValueError,
    TypeError,
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
)


def _stopped(stop: BaseException) -> SystemExit:
    word, code = stop_status(stop)
    print(f"nonstop: {word}", file=sys.stderr)
    return SystemExit(code)


@contextlib.contextmanager
def user_errors():
    """Errors to one line and an exit status; a stop (Ctrl-C, ``Terminated`` where a handler raises it) to
    "interrupted" / "terminated", also when an error it caused on its way out replaced it (``stop_behind``)."""
    try:
        yield
    except (KeyboardInterrupt, Terminated) as exc:
        raise _stopped(exc) from None
    except Exception as exc:
        stop = stop_behind(exc)
        if stop is not None:
            raise _stopped(stop) from None
        if isinstance(exc, USER_ERRORS):
            print_line(f"nonstop: error: {exc}")
            raise SystemExit(2) from None
        if isinstance(exc, BrokenPipeError):  # output piped into `head` and the like
            sys.stderr.close()
            raise SystemExit(0) from None
        if os.environ.get("NONSTOP_DEBUG"):
            raise
        print(
            f"nonstop: internal error: {type(exc).__name__}: {exc} (a bug: please report it; NONSTOP_DEBUG=1 shows "
            "the traceback)",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
