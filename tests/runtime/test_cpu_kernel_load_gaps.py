"""``runtime/cpu/kernels.load_kernels``: a build that fails (no compiler, a compile error: torch raises a
RuntimeError; missing headers; an unwritable cache) is reported as one line and the executor falls back to
torch ops, not a traceback; the outcome is decided once per process (a second call neither rebuilds nor
registers the fake kernels again)."""

from __future__ import annotations

import pytest

from nonstop.runtime.cpu import kernels


@pytest.mark.parametrize(
    "exc,want",
    [
        (RuntimeError("Error building extension 'nonstop_cpu_gemv'\ng++: not found"), "RuntimeError: Error building"),
        (OSError("No such file or directory: 'c++'"), "OSError: No such file or directory: 'c++'"),
        (ImportError("libgomp.so.1: cannot open"), "ImportError: libgomp.so.1: cannot open"),
    ],
)
def test_a_failed_build_is_one_line_and_remembered(tmp_path, monkeypatch, exc, want):
    """The first line of the error, prefixed with its type; a second call answers the same without building
    again (each build attempt costs minutes)."""
    monkeypatch.setenv("NONSTOP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_state", {})
    attempts = []

    def failing(build, progress):
        attempts.append(build)
        raise exc

    monkeypatch.setattr(kernels, "_load", failing)
    got = kernels.load_kernels(progress=False)
    assert got.startswith(want) and "\n" not in got
    assert kernels.load_kernels(progress=False) == got and len(attempts) == 1


def test_a_successful_load_happens_once_and_registers_the_fakes_once(tmp_path, monkeypatch):
    """After a load that succeeded, later calls return None at once: no second build and no second
    registration of the fake kernels (torch refuses one, which would turn into a spurious "unavailable")."""
    monkeypatch.setenv("NONSTOP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_state", {})
    calls = {"load": 0, "fakes": 0}
    monkeypatch.setattr(kernels, "_load", lambda build, progress: calls.__setitem__("load", calls["load"] + 1))
    monkeypatch.setattr(kernels, "_register_fakes", lambda: calls.__setitem__("fakes", calls["fakes"] + 1))
    assert kernels.load_kernels(progress=False) is None
    assert kernels.load_kernels(progress=False) is None
    assert calls == {"load": 1, "fakes": 1}


def test_a_stale_torch_lock_is_removed_and_a_fresh_build_is_announced(tmp_path, monkeypatch, capsys):
    """Under nonstop's flock torch's ``lock`` file is stale and removed before torch's load; the build is
    announced only when the folder holds no built library yet."""
    import torch.utils.cpp_extension as cpp_extension

    seen = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: seen.append((tmp_path / "lock").exists()))
    (tmp_path / "lock").write_text("")
    kernels._load(tmp_path, progress=True)
    assert seen == [False]
    assert "building the C++ CPU kernels" in capsys.readouterr().err
    (tmp_path / "nonstop_cpu_gemv.so").write_bytes(b"")
    kernels._load(tmp_path, progress=True)
    assert capsys.readouterr().err == ""


def test_the_flock_is_not_on_torchs_own_lock_file(tmp_path, monkeypatch):
    """nonstop's flock must be on a file of its own: torch's ``lock`` is deleted under the flock (as stale) and
    re-created by torch's build, so a flock on it would let a second process lock a fresh file and build at the
    same time."""
    from contextlib import contextmanager

    monkeypatch.setenv("NONSTOP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_state", {})
    locked = []

    @contextmanager
    def recording(path, message):
        locked.append(path)
        yield

    monkeypatch.setattr(kernels, "exclusive", recording)
    monkeypatch.setattr(kernels, "_load", lambda build, progress: None)
    monkeypatch.setattr(kernels, "_register_fakes", lambda: None)
    assert kernels.load_kernels(progress=False) is None
    assert len(locked) == 1 and locked[0].parent == kernels.build_directory() and locked[0].name != "lock"
