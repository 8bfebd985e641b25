"""Gaps in the tests of ``nonstop.cache_dirs`` and ``nonstop.file_lock`` found by mutation."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

from nonstop.cache_dirs import cache_root, private_dir
from nonstop.file_lock import exclusive


def test_an_empty_nonstop_cache_dir_is_unset(tmp_path, monkeypatch):
    """NONSTOP_CACHE_DIR="" (exported but empty) falls back to XDG_CACHE_HOME; taking it as set would put the
    cache in the current directory (``Path("")`` is ``.``)."""
    monkeypatch.setenv("NONSTOP_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "nonstop"


def test_without_any_setting_the_cache_is_under_home_dot_cache(tmp_path, monkeypatch):
    """Neither variable set (or XDG_CACHE_HOME empty): ~/.cache/nonstop, not ~/nonstop."""
    monkeypatch.delenv("NONSTOP_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_root() == tmp_path / "home" / ".cache" / "nonstop"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert cache_root() == tmp_path / "home" / ".cache" / "nonstop"


def test_a_group_writable_folder_loses_the_group_write_bit(tmp_path, monkeypatch):
    """A folder an earlier version made under umask 002 (mode 0775, group-writable only) is made 0755: the
    group write bit alone must trigger the fix, not only the others' bit."""
    monkeypatch.setenv("NONSTOP_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "ext"
    folder.mkdir(parents=True)
    os.chmod(folder, 0o775)
    assert private_dir("ext") == folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755


def _hold_and_record(path: Path, events: list, hold_s: float, waiting: str | None = None) -> None:
    with exclusive(path, waiting):
        events.append(("in", time.monotonic()))
        time.sleep(hold_s)
        events.append(("out", time.monotonic()))


def test_two_holders_of_the_lock_never_overlap(tmp_path):
    """``exclusive`` is exclusive: a second holder (another open of the file, as another process would have)
    waits until the first leaves - a shared lock, or a wait that is skipped, lets both in at once."""
    path = tmp_path / "locks" / "a.lock"
    first, second = [], []
    t1 = threading.Thread(target=_hold_and_record, args=(path, first, 0.5))
    t1.start()
    deadline = time.monotonic() + 10
    while not first and time.monotonic() < deadline:
        time.sleep(0.01)
    assert first, "the first holder never got the lock"
    t2 = threading.Thread(target=_hold_and_record, args=(path, second, 0.0))
    t2.start()
    t1.join(10)
    t2.join(10)
    assert [e for e, _ in first] == ["in", "out"] and [e for e, _ in second] == [
        "in",
        "out",
    ]
    assert second[0][1] >= first[1][1], "the second holder entered while the first still held the lock"


def test_the_lock_file_folder_is_made_and_a_waiter_says_what_it_waits_for(tmp_path, capfd):
    """The lock's folder is created when missing, and a process that has to wait prints ``waiting`` on stderr
    (``... `` first, ``: done after N s`` once it holds the lock); one that does not wait prints nothing."""
    path = tmp_path / "new" / "deeper" / "b.lock"
    with exclusive(path, "waiting for the build"):
        assert path.exists()
    assert capfd.readouterr().err == ""
    first, second = [], []
    t1 = threading.Thread(target=_hold_and_record, args=(path, first, 0.4))
    t1.start()
    while not first:
        time.sleep(0.01)
    _hold_and_record(path, second, 0.0, waiting="waiting for the build")
    t1.join(10)
    err = capfd.readouterr().err.splitlines()
    assert err[0] == "waiting for the build ..."
    assert err[1].startswith("waiting for the build: done after ") and err[1].endswith(" s")
