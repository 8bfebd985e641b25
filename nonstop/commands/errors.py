"""Turn the errors a user can fix into one clear line on stderr (exit status 2), never a traceback."""

from __future__ import annotations

import contextlib
import sys

from nonstop.config import ConfigError
from nonstop.weights.errors import CheckpointError

USER_ERRORS = (ConfigError, CheckpointError, ValueError, TypeError, FileNotFoundError, PermissionError, IsADirectoryError)


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
    except KeyboardInterrupt:
        print("nonstop: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
