"""Turn the errors a user can fix into one clear line on stderr (exit status 2), never a traceback.

Anything else is a bug in nonstop: one line saying so (exit status 1); NONSTOP_DEBUG=1 shows the traceback.
"""

from __future__ import annotations

import contextlib
import os
import sys

from nonstop.config import ConfigError
from nonstop.stops import Terminated, stop_status
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


@contextlib.contextmanager
def user_errors():
    try:
        yield
    except USER_ERRORS as exc:
        print(f"nonstop: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        raise SystemExit(0) from None
    except (KeyboardInterrupt, Terminated) as exc:  # Ctrl-C; SIGTERM where a handler raises it (a checkpoint write)
        word, code = stop_status(exc)
        print(f"nonstop: {word}", file=sys.stderr)
        raise SystemExit(code) from None
    except Exception as exc:
        if os.environ.get("NONSTOP_DEBUG"):
            raise
        print(
            f"nonstop: internal error: {type(exc).__name__}: {exc} (a bug: please report it; NONSTOP_DEBUG=1 shows "
            "the traceback)",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
