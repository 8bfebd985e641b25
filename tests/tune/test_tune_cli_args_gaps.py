"""``nonstop tune`` / ``tune verify`` argument handling (``nonstop/commands/tune.py``): the --rows and
--store parsers, the step-size checks, the default rows, the --list lines and ``tune verify``'s exit
status. No kernel is verified here: the verifier and the target are replaced by fakes."""

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest

import nonstop.commands.tune as tune_cmd
from nonstop.cli import build_parser


def _parse(*argv):
    return build_parser().parse_args(["tune", *argv])


@pytest.mark.parametrize("text", ["0", "0,1", "17", "1,17", "-1", " "])
def test_rows_out_of_range_are_refused(text):
    """--rows takes decode batch sizes 1..16 only (a step runs at most 16 rows); 0 or 17 is an error."""
    with pytest.raises(argparse.ArgumentTypeError):
        tune_cmd._rows(text)


def test_rows_are_sorted_and_deduplicated():
    """--rows "8, 1,4,4 16" is 1, 4, 8, 16: the edges 1 and 16 are valid."""
    assert tune_cmd._rows("8, 1,4,4 16") == [1, 4, 8, 16]


@pytest.mark.parametrize("text", ["", "   ", "dir/"])
def test_store_path_must_name_a_file(text):
    """--store of blanks (``Path("  ")`` is a file named by spaces) or a directory is an argument error."""
    with pytest.raises(argparse.ArgumentTypeError):
        tune_cmd._store_arg(text)


def test_store_path_expands_the_home_directory(monkeypatch, tmp_path):
    """--store ~/t.json is the file under $HOME, not a folder named "~"."""
    monkeypatch.setenv("HOME", str(tmp_path))
    args = _parse("--store", "~/t.json")
    assert tune_cmd._store_path(args) == tmp_path / "t.json"


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--op", "sample"], "unknown op kind 'sample'"),  # the sampler is no super-op to tune
        (["--op", "mlp", "--tokens", "17"], "--tokens must be in 1..16"),
        (["--op", "mlp", "--rows", "3", "--tokens", "8"], "--rows 3 x --tokens 8"),
    ],
)
def test_target_checks_before_any_work(argv, match):
    """Kinds, T and B x T are checked before a model is built; the message names the bad value."""
    with pytest.raises(ValueError, match=match):
        tune_cmd._target(_parse(*argv, "--device", "cpu"))


@pytest.mark.parametrize("tokens, rows", [(1, [1, 3]), (8, [1]), (16, [1])])
def test_default_rows_on_a_cpu_fit_a_step(monkeypatch, tokens, rows):
    """Without --rows a CPU tunes B = 1 and 3, less those whose B x T exceeds a step's 16 rows."""
    seen = {}

    def fake(kind, model, cfg, dtype, device, rows_, tokens_, context):
        seen.update(rows=rows_, tokens=tokens_, model=model)
        return "target"

    import nonstop.tune.target

    monkeypatch.setattr(nonstop.tune.target, "make_target", fake)
    args = _parse("--op", "mlp", "-m", "k3-nano", "--device", "cpu", "--tokens", str(tokens))
    assert tune_cmd._target(args) == "target"
    assert seen == {"rows": rows, "tokens": tokens, "model": "k3-nano"}


def _entry(**kw):
    base = {"device": "NVIDIA H100", "kind": "mlp", "shape": "B1xT1", "kernel": "k.py", "created": "2026-01-02"}
    return {**base, **kw}


def test_entry_line_of_a_timed_and_an_untimed_entry():
    """A timed entry prints microseconds (ms x 1000) beside the built-in kernel and the floor; an
    untimed one says so; missing origin fields print as "?"."""
    timed = _entry(timed=True, time_ms=0.0123, builtin_ms=0.02, floor_ms=0.01, proposer="search", round=2)
    timed["candidate"] = "r2c1"
    assert tune_cmd._entry_line(timed) == (
        "NVIDIA H100 | mlp | B1xT1 | 12.30 us (built-in 20.00 us, floor 10.00 us) | search round 2 (r2c1)"
        " | k.py | 2026-01-02"
    )
    assert tune_cmd._entry_line(_entry(timed=False)) == (
        "NVIDIA H100 | mlp | B1xT1 | verified, untimed | ? round ? (?) | k.py | 2026-01-02"
    )


@pytest.mark.parametrize("count, word", [(1, "1 entry"), (2, "2 entries")])
def test_list_counts_entries(monkeypatch, capsys, count, word):
    """``tune --list`` heads its lines with the count, singular for one entry."""
    import nonstop.tune.store

    monkeypatch.setattr(nonstop.tune.store, "rows", lambda path: [_entry(timed=False)] * count)
    assert tune_cmd.list_store(Path("s.json")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"s.json: {word}" and len(out) == 1 + count


def test_list_with_the_store_off(capsys):
    """NONSTOP_TUNING_STORE=off (no path): --list says the store is off."""
    assert tune_cmd.list_store(None) == 0
    assert "off" in capsys.readouterr().out


def test_no_store_writes_no_store(monkeypatch, tmp_path):
    """--no-store: the tuning loop gets no store path (and none is checked), even with --store given."""
    import nonstop.tune.loop
    import nonstop.tune.store

    seen = {}
    target = SimpleNamespace(describe=lambda: "t", shapes=[], device=SimpleNamespace(type="cpu"))
    monkeypatch.setattr(tune_cmd, "_target", lambda args: target)
    monkeypatch.setattr(nonstop.tune.store, "check_writable", lambda p: seen.setdefault("checked", p))

    def fake_tune(target, proposer, rounds, candidates, path, timeout, say):
        seen["path"] = path
        return SimpleNamespace(lines=lambda: [], outcomes=[])

    monkeypatch.setattr(nonstop.tune.loop, "tune", fake_tune)
    store = tmp_path / "t.json"
    assert tune_cmd.run(_parse("--op", "mlp", "--store", str(store), "--no-store")) == 0
    assert seen == {"path": None}
    assert tune_cmd.run(_parse("--op", "mlp", "--store", str(store))) == 0
    assert seen == {"path": store, "checked": store}


def _verify_args(*extra):
    return _parse("verify", "--op", "mlp", *extra)


@pytest.mark.parametrize("extra", [[], ["--builtin", "--kernel", "k.py"]])
def test_verify_needs_exactly_one_source(extra):
    """tune verify takes --kernel FILE or --builtin, never both or neither."""
    with pytest.raises(ValueError, match="exactly one"):
        tune_cmd.run_verify(_verify_args(*extra))


def test_verify_refuses_a_directory_as_the_kernel(tmp_path):
    """--kernel DIR is no candidate file (reading it would fail with IsADirectoryError later)."""
    with pytest.raises(FileNotFoundError, match="no candidate file"):
        tune_cmd.run_verify(_verify_args("--kernel", str(tmp_path)))


@pytest.mark.parametrize("accepted, status", [(True, 0), (False, 1)])
def test_verify_exit_status_and_flags(monkeypatch, tmp_path, capsys, accepted, status):
    """Exit 0 when accepted, 1 when rejected; --no-time reaches the verifier, a file is untrusted."""
    import nonstop.tune.verify as verify_mod

    seen = {}
    target = SimpleNamespace(describe=lambda: "t", skipped=[])
    monkeypatch.setattr(tune_cmd, "_target", lambda args: target)

    def fake_verify(source, target, trusted, time_it, timeout_s, progress):
        seen.update(source=source, trusted=trusted, time_it=time_it)
        return verify_mod.Verdict(accepted, [] if accepted else ["wrong"], {"stage": "dynamic"})

    monkeypatch.setattr(verify_mod, "verify", fake_verify)
    kernel = tmp_path / "k.py"
    kernel.write_text("def launch(op, env):\n    pass\n")
    assert tune_cmd.run_verify(_verify_args("--kernel", str(kernel), "--no-time")) == status
    assert seen == {"source": kernel.read_text(), "trusted": False, "time_it": False}
    out = capsys.readouterr().out
    assert ("ACCEPTED" in out) == accepted and ("REJECTED (dynamic)" in out) == (not accepted)
