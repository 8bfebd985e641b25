"""`nonstop tune` never destroys or half-writes a tuning store, checks its arguments before any work, and an
executor reading a store it cannot use falls back to the built-in kernels with one plain line.

The tuning loop is replaced by a poison here: a check that comes after the loop (or never) fails the test."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nonstop.cli import build_parser, main
from nonstop.runtime import tuned
from nonstop.tune import sandbox, store

TUNE = ["tune", "-m", "k3-nano", "--op", "linear_residual", "--rows", "1", "--rounds", "1", "--candidates", "1"]
ENTRY = {"proposer": "test", "round": 1, "candidate": "r1c1", "timed": False, "time_ms": None}

# A store file that exists but is no tuning store this nonstop can use; each must be left as it is.
BROKEN = {
    "truncated": None,  # the first two thirds of a real store (what the tester found)
    "binary": b"\xff\xfe\x00\x81garbage",
    "empty": b"",
    "a list": b"[]",
    "entries not an object": b'{"version": 1, "entries": []}',
    "a device not an object": b'{"version": 1, "entries": {"cpu": []}}',
    "an entry not an object": b'{"version": 1, "entries": {"cpu": {"mlp": {"B1xT1": 3}}}}',
    "an entry without its kernel": b'{"version": 1, "entries": {"cpu": {"linear_residual": {"k": {}}}}}',
    "a time that is no number": b'{"version": 1, "entries": {"cpu": {"mlp": {"k": {"kernel": "kernels/x.py", '
    b'"sha256": "0", "timed": true, "time_ms": "x"}}}}}',
    "a later version": b'{"version": 2, "entries": {}}',
    "nested too deeply": b"[" * 100_000,
}


@pytest.fixture(autouse=True)
def no_tuning(monkeypatch, tmp_path):
    """The default store is a throwaway path, and running the tuning loop fails the test."""
    monkeypatch.setenv("NONSTOP_TUNING_STORE", str(tmp_path / "default" / "tuning.json"))

    def poison(*args, **kwargs):
        raise AssertionError("the tuning loop ran")

    monkeypatch.setattr("nonstop.tune.loop.tune", poison)


def _valid_store(path: Path) -> bytes:
    for n in range(3):
        store.record(path, "cpu", "linear_residual", f"B{n + 1}xT1 w=256x128 float32", f"# kernel {n}\n", ENTRY)
    return path.read_bytes()


def _broken_store(path: Path, kind: str) -> bytes:
    data = BROKEN[kind]
    if data is None:
        full = _valid_store(path)
        data = full[: len(full) * 2 // 3]
    path.write_bytes(data)
    return data


def _exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".tuning-") or p.name == "kernels")


# ----------------------------------------------------------------------------- an unreadable store


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_tune_refuses_an_unreadable_store_before_tuning_and_leaves_it(kind, tmp_path, capsys):
    path = tmp_path / "tuning.json"
    before = _broken_store(path, kind)
    kernels = sorted((tmp_path / "kernels").iterdir()) if (tmp_path / "kernels").exists() else []
    assert _exit_code([*TUNE, "--store", str(path)]) == 2
    assert path.read_bytes() == before
    assert (sorted((tmp_path / "kernels").iterdir()) if (tmp_path / "kernels").exists() else []) == kernels
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tuning-")]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nonstop: error: tuning store ") and str(path) in err[0], err


@pytest.mark.parametrize("kind", ["truncated", "binary", "a list", "a device not an object"])
def test_list_of_an_unreadable_store_is_an_error(kind, tmp_path, capsys):
    path = tmp_path / "tuning.json"
    _broken_store(path, kind)
    assert _exit_code(["tune", "--list", "--store", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "no entries" not in out
    assert len(err.strip().splitlines()) == 1 and str(path) in err and "nonstop: error:" in err


@pytest.mark.parametrize(
    ("kind", "phrase"),
    [("an entry without its kernel", "['k'] has no 'kernel'"), ("a time that is no number", "'time_ms' str")],
)
def test_list_names_the_malformed_entry(kind, phrase, tmp_path, capsys):
    path = tmp_path / "tuning.json"
    _broken_store(path, kind)
    assert _exit_code(["tune", "--list", "--store", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nonstop: error: tuning store ") and phrase in err[0], err


def test_list_shows_an_entry_with_only_the_fields_it_needs(tmp_path, capsys):
    """The executor run's own store (``exec_check``) records a proposer and nothing else of provenance."""
    path = tmp_path / "tuning.json"
    store.record(path, "cpu", "mlp", "B1xT1 w=8x8 float32", "# the kernel\n", {"proposer": "verify"})
    assert main(["tune", "--list", "--store", str(path)]) == 0
    assert "verified, untimed | verify round ?" in capsys.readouterr().out
    assert tuned.load_store(path)["entries"]["cpu"]["mlp"]


def test_record_never_replaces_an_unreadable_store(tmp_path):
    path = tmp_path / "tuning.json"
    before = _broken_store(path, "truncated")
    with pytest.raises(ValueError, match="not valid JSON"):
        store.record(path, "cpu", "mlp", "B1xT1 w=8x8 float32", "# new\n", ENTRY)
    assert path.read_bytes() == before


def test_list_still_lists_a_good_store(tmp_path, capsys):
    path = tmp_path / "tuning.json"
    _valid_store(path)
    assert main(["tune", "--list", "--store", str(path)]) == 0
    assert f"{path}: 3 entries" in capsys.readouterr().out


def test_an_executor_reading_an_unreadable_store_warns_in_one_plain_line(tmp_path):
    """The built-in kernels run (an empty store); stderr holds the reason once, no Python warning and
    no source line, even when the store is read twice."""
    path = tmp_path / "tuning.json"
    _broken_store(path, "truncated")
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "from nonstop.runtime.tuned import load_store, store_path\n"
        "assert load_store(store_path()) == {'version': 1, 'entries': {}}\n"
        "assert load_store(store_path())['entries'] == {}\n"
    )
    env = {**os.environ, "NONSTOP_TUNING_STORE": str(path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"tuning store {path} is not valid JSON ("), run.stderr
    assert lines[0].endswith("); using the built-in kernels"), run.stderr


@pytest.mark.parametrize("kind", ["binary", "a device not an object", "nested too deeply"])
def test_use_tuned_falls_back_on_any_unreadable_store(kind, tmp_path, monkeypatch, caplog):
    path = tmp_path / "tuning.json"
    _broken_store(path, kind)
    monkeypatch.setenv("NONSTOP_TUNING_STORE", str(path))
    with caplog.at_level("WARNING", logger="nonstop.tuning"):
        assert tuned.load_store(tuned.store_path()) == {"version": 1, "entries": {}}
    assert [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]


# ----------------------------------------------------------------------------- the store path


@pytest.mark.parametrize(
    "where",
    ["the directory itself", "a directory with a slash", "empty", "under a regular file", "under /proc"],
)
def test_tune_checks_the_store_path_before_tuning(where, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "file").write_text("a regular file\n")
    if where == "under /proc" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc")
    store_arg = {
        "the directory itself": str(work),
        "a directory with a slash": str(work) + "/",
        "empty": "",
        "under a regular file": str(work / "file" / "tuning.json"),
        "under /proc": "/proc/nonstop-no-such-dir/tuning.json",
    }[where]
    assert _exit_code([*TUNE, "--store", store_arg]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "error" in err[-1] and "internal error" not in err[-1] and "Errno" not in err[-1], err
    assert _leftovers(work) == []
    assert sorted(p.name for p in work.iterdir()) == ["file"]


def test_tune_checks_the_kernels_folder_before_tuning(tmp_path, capsys):
    """The winners' files go to ``kernels/`` beside the store: a file of that name fails before any work."""
    (tmp_path / "kernels").write_text("not a folder\n")
    assert _exit_code([*TUNE, "--store", str(tmp_path / "tuning.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error" not in err[0], err
    assert str(tmp_path / "kernels") in err[0] and "a file of that name exists" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernels"]


def test_the_store_check_creates_the_directory_save_would_create(tmp_path):
    """A missing parent is created (as ``save`` does) and nothing else is left there."""
    path = tmp_path / "new" / "dir" / "tuning.json"
    store.check_writable(path)
    assert path.parent.is_dir() and list(path.parent.iterdir()) == [] and not path.exists()


def test_save_removes_its_temporary_file_when_the_write_fails(tmp_path):
    path = tmp_path / "tuning.json"
    before = _valid_store(path)
    with pytest.raises(TypeError):
        store.save(path, {"version": 1, "entries": {"cpu": object()}})  # fails half-way through the dump
    assert path.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tuning-")]


def test_save_removes_its_temporary_file_when_the_replace_fails(tmp_path, monkeypatch):
    path = tmp_path / "tuning.json"
    before = _valid_store(path)

    def refuse(src, dst):
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        store.save(path, json.loads(before))
    assert path.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tuning-")]


def test_a_kernel_file_cut_short_is_written_again(tmp_path):
    path = tmp_path / "tuning.json"
    store.record(path, "cpu", "mlp", "B1xT1 w=8x8 float32", "# the kernel\nX = 1\n", ENTRY)
    kernel = next((tmp_path / "kernels").iterdir())
    kernel.write_text("# the ker")  # an earlier write that stopped half-way
    store.record(path, "cpu", "mlp", "B2xT1 w=8x8 float32", "# the kernel\nX = 1\n", ENTRY)
    assert kernel.read_text() == "# the kernel\nX = 1\n"


KEY = "B1xT1 w=8x8 float32"


def _kernel_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "kernels").iterdir())


def test_a_candidate_not_stored_leaves_no_kernel_file(tmp_path):
    path = tmp_path / "tuning.json"
    assert store.record(path, "cpu", "mlp", KEY, "# first\n", ENTRY)
    kept = _kernel_files(tmp_path)
    assert not store.record(path, "cpu", "mlp", KEY, "# second, untimed: not better\n", ENTRY)
    assert _kernel_files(tmp_path) == kept


@pytest.mark.parametrize("damage", ["edited", "missing"])
def test_an_entry_whose_kernel_file_is_unusable_is_replaced(tmp_path, damage):
    """The executor skips an entry whose file fails its hash check, so the place is empty: an untimed
    winner (a CPU run) takes it."""
    path = tmp_path / "tuning.json"
    store.record(path, "cpu", "mlp", KEY, "# first\n", ENTRY)
    first = tmp_path / json.loads(path.read_text())["entries"]["cpu"]["mlp"][KEY]["kernel"]
    if damage == "edited":
        first.write_text("# first, edited\n")
    else:
        first.unlink()
    assert store.record(path, "cpu", "mlp", KEY, "# second\n", ENTRY)
    entry = json.loads(path.read_text())["entries"]["cpu"]["mlp"][KEY]
    assert (tmp_path / entry["kernel"]).read_text() == "# second\n"
    assert tuned.kernel_problem(tmp_path, entry) is None


# ----------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "-inf", "0.0", "abc", ""])
@pytest.mark.parametrize("command", [["tune"], ["tune", "verify"]])
def test_timeout_must_be_a_positive_finite_number(command, value, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*command, "--op", "mlp", f"--timeout={value}"])
    assert info.value.code == 2
    assert "--timeout" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "x"])
@pytest.mark.parametrize("command", [["tune"], ["tune", "verify"]])
def test_context_must_be_at_least_one(command, value, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*command, "--op", "mlp", f"--context={value}"])
    assert info.value.code == 2
    assert "--context" in capsys.readouterr().err


def test_verify_takes_no_store():
    """``tune verify`` writes no store: a --store there would be silently ignored."""
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["tune", "verify", "--op", "mlp", "--store", "x.json"])
    assert info.value.code == 2
    assert build_parser().parse_args(["tune", "--store", "x.json", "--list"]).store == Path("x.json")


def test_good_numbers_still_parse():
    args = build_parser().parse_args(["tune", "--op", "mlp", "--timeout", "0.5", "--context", "1"])
    assert (args.timeout, args.context) == (0.5, 1)


@pytest.mark.parametrize("timeout", [0, -1.0, math.nan, math.inf])
def test_the_sandbox_refuses_a_timeout_it_cannot_keep(timeout, tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox.subprocess, "Popen", lambda *a, **k: pytest.fail("a child was started"))
    with pytest.raises(ValueError, match="timeout must be a positive finite number"):
        sandbox.run_child(tmp_path, torch.device("cpu"), timeout)


def test_rows_that_do_not_fit_the_tokens_are_an_error(tmp_path, capsys):
    """--rows 1,16 --tokens 2 would tune B=16 x T=2 = 32 rows, more than a decode step runs: it used to
    drop the 16 silently and tune only B=1."""
    argv = [*TUNE[:5], "--rows", "1,16", "--tokens", "2", "--store", str(tmp_path / "t.json")]
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert "--rows 16 x --tokens 2" in err and "up to 8" in err
    assert not (tmp_path / "t.json").exists()


def test_default_rows_that_do_not_fit_the_tokens_are_left_out():
    """Rows not given: the defaults that fit T are tuned (on a CPU 1,3; with T=8 only B=1)."""
    from nonstop.commands.tune import _target

    args = build_parser().parse_args(["tune", "-m", "k3-nano", "--op", "linear_residual", "--tokens", "8"])
    args.device = "cpu"
    assert {(s.B, s.T) for s in _target(args).shapes} == {(1, 8)}


def test_store_and_kernel_files_follow_the_umask(tmp_path):
    """mkstemp creates 0600 files: the store and its kernel files are as readable as the user's umask allows
    (a cache shared by a team)."""
    import stat

    from nonstop.tune import store

    old = os.umask(0o022)
    try:
        source = "def k():\n    pass\n"
        rel, sha = store.kernel_file("mlp", source)
        store.write_kernel(tmp_path, rel, sha, source)
        store.save(tmp_path / "tuned.json", {"version": 1, "entries": {}})
    finally:
        os.umask(old)
    for f in (tmp_path / rel, tmp_path / "tuned.json"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f


def test_two_runs_recording_into_one_store_keep_both_winners(tmp_path, monkeypatch):
    """Each record reads the store, adds its entry and writes the whole file: two tuning runs interleaving
    those steps lost the first one's entry. The read is slowed here so the writers overlap every time."""
    import threading
    import time

    path = tmp_path / "tuning.json"
    slow_read = store.read_store

    def read_store(p):
        data = slow_read(p)
        time.sleep(0.05)
        return data

    monkeypatch.setattr(store, "read_store", read_store)
    keys = [f"B1xT1 w={n}x8 float32" for n in range(6)]
    threads = [
        threading.Thread(target=store.record, args=(path, "cpu", "mlp", key, f"# kernel {key}\n", ENTRY))
        for key in keys
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(json.loads(path.read_text())["entries"]["cpu"]["mlp"]) == keys
