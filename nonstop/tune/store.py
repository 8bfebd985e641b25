"""Writing the tuning store (the reader, used by the executor, is ``nonstop/runtime/tuned.py``).

An entry is keyed by (device name, op kind, shape key) and holds the winner's file (``kernels/<kind>-
<sha12>.py`` beside the JSON, checked by SHA-256 when read) and its provenance: proposer, round,
candidate id, model, the verification record (seed, cases, checks), the times (GPU) or ``timed:
false`` (CPU), versions and date. ``better(new, old)``: a timed entry beats an untimed one and a slower
one; an untimed entry only fills an empty place (on a CPU nothing is faster than anything). An entry whose
kernel file is missing or fails its hash check, or that was checked under older candidate rules (its
``rules`` below ``runtime.tuned.CANDIDATE_RULES``), is an empty place; a kernel file is written only when its
entry is stored.

A store file that exists but cannot be read as a tuning store is never replaced: ``record``, ``rows`` and
``check_writable`` raise ``StoreError`` (a ``ValueError``) naming the file and the reason. ``record``
reads, updates and writes the store under an exclusive lock on ``.<name>.lock`` beside it, so two tuning
runs sharing a store each keep their winners (without it the later write dropped the earlier one's).
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

from nonstop.file_lock import exclusive
from nonstop.runtime.tuned import CANDIDATE_RULES, kernel_problem, read_store, rules_problem
from nonstop.weights.write import write_atomically

KERNELS_DIR = "kernels"  # the winners' files, beside the store's JSON


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


def _write_atomically(path: Path, text: str) -> None:
    write_atomically(path, lambda f: f.write(text.encode()))


def kernel_file(kind: str, source: str) -> tuple[str, str]:
    """(file path relative to the store's directory, SHA-256) of the kernel ``source``."""
    sha = hashlib.sha256(source.encode()).hexdigest()
    return f"{KERNELS_DIR}/{kind}-{sha[:12]}.py", sha


def write_kernel(root: Path, rel: str, sha: str, source: str) -> None:
    """Write ``source`` to ``root / rel`` once (again when the file there does not hold it, e.g. a write
    cut short)."""
    if kernel_problem(root, {"kernel": rel, "sha256": sha}):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(root / rel, source)


def save(path: Path, data: dict) -> None:
    """Write the JSON atomically (a reader never sees half a file; no temporary file is left behind)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, json.dumps(data, indent=1, sort_keys=True))


def check_writable(path: Path) -> None:
    """Raise ``ValueError`` (one line naming ``path`` and why) unless ``record`` can write the store at
    ``path``: a file path, not a directory; an existing file must be a readable tuning store (it is
    never replaced otherwise); its directory is created as ``save`` would and must take new files, and so
    must the ``kernels`` folder beside it when there is one (a file of that name is an error).
    Called before tuning, so a bad path fails before any work is done."""
    if path == Path("."):  # what Path("") becomes
        raise ValueError("the tuning store path is empty; give a JSON file path")
    try:
        is_dir = path.is_dir()
    except OSError as exc:
        raise ValueError(f"tuning store {path} cannot be checked ({exc.strerror or exc})") from None
    if is_dir:
        raise ValueError(f"tuning store {path} is a directory; give a JSON file path, e.g. {path / 'tuning.json'}")
    read_store(path)  # StoreError when it exists but is unreadable or not a tuning store
    _check_directory(path, path.parent)
    kernels = path.parent / KERNELS_DIR
    if kernels.exists() or kernels.is_symlink():  # missing: the directory above takes it, as checked
        _check_directory(path, kernels)


def _check_directory(path: Path, folder: Path) -> None:
    """Create ``folder`` (of the store at ``path``) as ``save`` / ``write_kernel`` would and probe that it
    takes new files; ``ValueError`` (one line naming the store, the folder and why) otherwise."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = exc.filename or folder
        why = "a file of that name exists" if isinstance(exc, FileExistsError) else exc.strerror or exc
        raise ValueError(f"tuning store {path}: cannot create its directory {where} ({why})") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".tuning-", dir=folder)
    except OSError as exc:
        raise ValueError(f"tuning store {path}: cannot write in {folder} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)


def _locked(path: Path):
    """An exclusive lock between processes on the lock file beside the store ``path``."""
    return exclusive(path.with_name(f".{path.name}.lock"))


def record(path: Path, device: str, kind: str, key: str, source: str, entry: dict) -> bool:
    """Store ``source`` as the winner at (device, kind, key) if it is ``better`` than what is there;
    returns whether it was stored. ``entry`` holds the provenance (see the module docstring). A store
    file that cannot be read raises ``StoreError`` and is left as it is. The read, the comparison and the
    write happen under the store's lock (another run's record waits)."""
    with _locked(path):
        return _record_locked(path, device, kind, key, source, entry)


def _record_locked(path: Path, device: str, kind: str, key: str, source: str, entry: dict) -> bool:
    data = read_store(path)
    slot = data["entries"].setdefault(device, {}).setdefault(kind, {})
    rel, sha = kernel_file(kind, source)
    new = {
        **entry,
        "kernel": rel,
        "sha256": sha,
        "rules": CANDIDATE_RULES,
        "versions": versions(),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    old = slot.get(key)
    if old is not None and (kernel_problem(path.parent, old) or rules_problem(old)):
        old = None  # its file is missing or changed, or older rules passed it: nothing usable holds the place
    if not better(new, old):
        return False
    write_kernel(path.parent, rel, sha, source)
    slot[key] = new
    save(path, data)
    return True


def rows(path: Path) -> list[dict]:
    """One dict per entry, for ``nonstop tune --list`` (``StoreError`` when the file cannot be read)."""
    out = []
    for device, kinds in sorted(read_store(path)["entries"].items()):
        for kind, shapes in sorted(kinds.items()):
            for key, e in sorted(shapes.items()):
                out.append({"device": device, "kind": kind, "shape": key, **e})
    return out
