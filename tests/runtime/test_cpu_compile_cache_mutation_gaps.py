"""``runtime/cpu/compile_cache.py`` and the C++ kernels' build key (``kernels.build_directory``): where
torch.compile's cache goes, what the user sees while something compiles, and a build folder per version of
every file the kernels are built from."""

from __future__ import annotations

import os
import stat
import time

import pytest

from nonstop.runtime.cpu import kernels
from nonstop.runtime.cpu.compile_cache import announced, use_inductor_cache


def test_inductor_cache_replaces_torchs_default_but_keeps_the_users_choice(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("NONSTOP_CACHE_DIR", str(tmp_path / "root"))
    for torch_wrote in (None, default_cache_dir()):  # unset, or torch's per-user temp folder written on first use
        if torch_wrote is None:
            monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        else:
            monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", torch_wrote)
        path = use_inductor_cache()
        assert path == tmp_path / "root" / "inductor" and path.is_dir()
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path)
    mine = tmp_path / "mine" / "deep"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(mine))
    assert use_inductor_cache() == mine and mine.is_dir()  # the user's folder, made when missing


def test_our_inductor_folder_is_writable_by_this_user_only(tmp_path, monkeypatch):
    """torch loads the compiled code the folder holds: like the kernels' ``ext/``, nobody else may write it,
    even under a umask of 002 or when an earlier version made it group-writable."""
    monkeypatch.setenv("NONSTOP_CACHE_DIR", str(tmp_path / "root"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    old = os.umask(0o002)
    try:
        made = use_inductor_cache()
    finally:
        os.umask(old)
    assert made == tmp_path / "root" / "inductor"
    assert stat.S_IMODE(made.stat().st_mode) & 0o022 == 0
    made.chmod(0o775)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert stat.S_IMODE(use_inductor_cache().stat().st_mode) & 0o022 == 0


def test_announced_prints_start_heartbeat_and_elapsed_only_when_enabled(capsys):
    with announced("compiling x", every_s=0.05) as timing:
        time.sleep(0.2)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "nonstop cpu: compiling x ..."
    assert any(line.startswith("nonstop cpu: ... still compiling x (") for line in err[1:-1])
    assert err[-1].startswith("nonstop cpu: compiling x: done in ") and err[-1].endswith(" s")
    assert timing["seconds"] >= 0.2
    with announced("quiet", enabled=False, every_s=0.01) as timing:
        time.sleep(0.05)
    assert capsys.readouterr().err == "" and timing["seconds"] >= 0.05


def test_announced_reports_the_elapsed_time_when_the_block_fails(capsys):
    with pytest.raises(KeyError), announced("failing", every_s=60) as timing:
        raise KeyError("x")
    assert "seconds" in timing and capsys.readouterr().err.splitlines()[-1].startswith("nonstop cpu: failing: done")


def test_the_kernels_build_folder_changes_with_every_source_and_header(tmp_path, monkeypatch):
    """A build reused after a source or header changed would load stale kernels: the folder's name hashes them all."""
    monkeypatch.setenv("NONSTOP_CACHE_DIR", str(tmp_path / "cache"))
    files = {}
    for p in kernels.SOURCES + kernels.HEADERS:
        files[p.name] = tmp_path / p.name
        files[p.name].write_bytes(p.read_bytes())
    monkeypatch.setattr(kernels, "SOURCES", [files[p.name] for p in kernels.SOURCES])
    monkeypatch.setattr(kernels, "HEADERS", [files[p.name] for p in kernels.HEADERS])
    first = kernels.build_directory()
    assert first.parent == tmp_path / "cache" / "ext" and kernels.torch.__version__ in first.name
    seen = {first}
    for f in files.values():
        f.write_bytes(f.read_bytes() + b"\n// changed\n")
        seen.add(kernels.build_directory())
    assert len(seen) == len(files) + 1
    monkeypatch.setattr(kernels.torch, "__version__", "0.0.0-other")
    assert kernels.build_directory() not in seen
