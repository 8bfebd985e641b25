"""Where nonstop keeps what it builds for later processes.

``cache_root()`` = $NONSTOP_CACHE_DIR, else $XDG_CACHE_HOME/nonstop, else ~/.cache/nonstop.
``private_dir(name)`` is a folder under it that only this user can write: for files nonstop later
imports or loads as code (generated kernel source, built C++ extensions), so that nobody else can put
code there that would run as this user (a shared $NONSTOP_CACHE_DIR, a folder made by someone else).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def cache_root() -> Path:
    if os.environ.get("NONSTOP_CACHE_DIR"):
        return Path(os.environ["NONSTOP_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "nonstop"


def private_dir(name: str) -> Path:
    """``cache_root() / name``, made with mode 0700 when missing, and write access for group and others
    taken away when this user owns it (a folder an earlier version made under a umask of 002); refused
    (PermissionError naming it) when another user owns it (a file in its place: FileExistsError)."""
    path = cache_root() / name
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise PermissionError(
            f"{path} holds code nonstop imports, but user id {info.st_uid} owns it; remove it or set"
            " NONSTOP_CACHE_DIR to a folder of your own"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        path.chmod(stat.S_IMODE(info.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))
    return path
