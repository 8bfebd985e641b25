"""Read the JSON files that travel with a checkpoint, with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path


def read_json_object(path: Path, error: type[Exception]) -> dict:
    """The JSON object in ``path``; ``error`` (naming the file) when it cannot be read, is not JSON (or is
    nested beyond the parser's depth), or holds something else than an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    except (ValueError, RecursionError) as exc:  # not JSON, or an integer past the parser's digit limit
        raise error(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: top level must be a JSON object, not {type(data).__name__}")
    return data
