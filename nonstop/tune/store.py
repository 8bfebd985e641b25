"""Writing the tuning store (the reader, used by the executor, is ``nonstop/runtime/tuned.py``).

An entry is keyed by (device name, op kind, shape key) and holds the winner's file (``kernels/<kind>-
<sha12>.py`` beside the JSON, checked by SHA-256 when read) and its provenance: proposer, round,
candidate id, model, the verification record (seed, cases, checks), the times (GPU) or ``timed:
false`` (CPU), versions and date. ``better(new, old)``: a timed entry beats an untimed one and a slower
one; an untimed entry only fills an empty place (on a CPU nothing is faster than anything).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path

import torch

from nonstop.runtime.tuned import load_store


def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        pass
    return out


def better(new: dict, old: dict | None) -> bool:
    if old is None:
        return True
    if new.get("timed") and not old.get("timed"):
        return True
    if new.get("timed") and old.get("timed"):
        return new["time_ms"] < old["time_ms"]
    return False


def write_kernel(root: Path, kind: str, source: str) -> tuple[str, str]:
    """(file path relative to the store's directory, SHA-256) of ``source``, written once."""
    sha = hashlib.sha256(source.encode()).hexdigest()
    rel = f"kernels/{kind}-{sha[:12]}.py"
    path = root / rel
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return rel, sha


def save(path: Path, data: dict) -> None:
    """Write the JSON atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tuning-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def record(path: Path, device: str, kind: str, key: str, source: str, entry: dict) -> bool:
    """Store ``source`` as the winner at (device, kind, key) if it is ``better`` than what is there;
    returns whether it was stored. ``entry`` holds the provenance (see the module docstring)."""
    data = load_store(path)
    slot = data["entries"].setdefault(device, {}).setdefault(kind, {})
    rel, sha = write_kernel(path.parent, kind, source)
    new = {
        **entry,
        "kernel": rel,
        "sha256": sha,
        "versions": versions(),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    if not better(new, slot.get(key)):
        return False
    slot[key] = new
    save(path, data)
    return True


def rows(path: Path) -> list[dict]:
    """One dict per entry, for ``nonstop tune --list``."""
    out = []
    for device, kinds in sorted(load_store(path)["entries"].items()):
        for kind, shapes in sorted(kinds.items()):
            for key, e in sorted(shapes.items()):
                out.append({"device": device, "kind": kind, "shape": key, **e})
    return out
