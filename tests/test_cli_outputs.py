"""Commands that write or read files refuse bad paths and values up front, with one line (exit 2): synth,
train and perplexity, as a user drives them."""

from __future__ import annotations

import pytest

from nonstop.cli import main
from nonstop.weights.resolve import ASSETS

TEXT = (ASSETS / "heldout_sample.txt").read_text(encoding="utf-8")


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err and "internal error" not in err, err
    return err


def _train(corpus, tmp_path, *extra) -> list[str]:
    return [
        "train",
        "--corpus",
        str(corpus),
        "--tokenizer",
        str(ASSETS / "k3-nano"),
        "--cache-dir",
        str(tmp_path / "tokens"),
        "--threads",
        "1",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--no-samples",
        *extra,
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--minutes", "nan"], "--minutes: expected a positive finite number"),
        (["--minutes", "inf"], "--minutes: expected a positive finite number"),
        (["--lr", "-1"], "--lr: expected a positive finite number"),
        (["--min-lr", "nan"], "--min-lr: expected a non-negative finite number"),
        (["--min-lr", "1", "--lr", "0.1"], "--min-lr 1 is above the peak --lr 0.1"),
        (["--seq-len", "4096"], "--seq-len 4096 exceeds the model's 2048 positions"),
    ],
)
def test_train_refuses_impossible_settings_before_training(corpus, tmp_path, capsys, extra, message):
    err = _refused([*_train(corpus, tmp_path, "--out", str(tmp_path / "out")), *extra], capsys)
    assert message in err and "[train " not in err  # no log line: nothing was tokenized or trained
    assert not (tmp_path / "out").exists()


def test_train_refuses_an_output_path_that_is_a_file_before_it_trains(corpus, tmp_path, capsys):
    (tmp_path / "afile").write_text("mine")
    err = _refused(_train(corpus, tmp_path, "--out", str(tmp_path / "afile"), "--max-steps", "2"), capsys)
    assert "is an existing file" in err and "trained:" not in err
    assert (tmp_path / "afile").read_text() == "mine"


def test_train_that_diverges_says_which_setting_to_change(corpus, tmp_path, capsys):
    argv = _train(corpus, tmp_path, "--out", str(tmp_path / "out"), "--max-steps", "6", "--lr", "1e6")
    err = _refused([*argv, "--warmup-steps", "1"], capsys)
    assert "training diverged" in err and "lower --lr" in err
    assert not (tmp_path / "out").exists()


def test_train_with_no_step_in_its_budget_writes_nothing(corpus, tmp_path, capsys):
    err = _refused(_train(corpus, tmp_path, "--out", str(tmp_path / "out"), "--minutes", "1e-9"), capsys)
    assert "no training step finished" in err
    assert not (tmp_path / "out").exists()


def test_train_with_an_empty_held_out_split_says_so(corpus, tmp_path, capsys):
    (corpus / "heldout.txt").write_text("")
    err = _refused(_train(corpus, tmp_path, "--out", str(tmp_path / "out"), "--max-steps", "1"), capsys)
    assert "heldout.txt holds 0 token(s)" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--out", ""], "--out is empty"),
        (["--shard-size", "nan"], "--shard-size: expected a positive finite number"),
        (["--seed", str(2**70)], "a seed must lie in"),
    ],
)
def test_synth_refuses_bad_values(tmp_path, capsys, extra, message):
    argv = ["synth", "--preset", "k3-nano", "--num-layers", "1", "--out", str(tmp_path / "s"), *extra]
    assert message in _refused(argv, capsys)


def test_perplexity_does_not_score_a_byte_order_mark(tmp_path, capsys):
    plain, marked = tmp_path / "plain.txt", tmp_path / "bom.txt"
    plain.write_text(TEXT[:400], encoding="utf-8")
    marked.write_bytes(b"\xef\xbb\xbf" + TEXT[:400].encode())
    results = []
    for f in (plain, marked):
        assert main(["perplexity", str(f), "--context", "64"]) == 0
        out, err = capsys.readouterr()
        results.append([ln for ln in out.splitlines() if ln.startswith(("tokens scored", "perplexity"))])
        assert "scored" in err  # progress on stderr
    assert results[0] == results[1]


def test_perplexity_refuses_a_window_past_the_models_positions_and_a_token_id_tokenizer(tmp_path, capsys):
    f = tmp_path / "t.txt"
    f.write_text(TEXT[:200], encoding="utf-8")
    assert "exceeds the model's 2048 positions" in _refused(["perplexity", str(f), "--context", str(10**20)], capsys)
    assert "invalid choice: 'ids'" in _refused(["perplexity", str(f), "--tokenizer", "ids"], capsys)


def test_byte_counting_commands_take_every_dtype_name_the_loader_does(capsys):
    """info / program / synth take the same dtype names (and aliases) as generate, not a narrower list."""
    from nonstop.commands.common import DTYPE_CHOICES
    from nonstop.weights.resolve import DTYPES

    assert set(DTYPE_CHOICES) == set(DTYPES)
    assert main(["info", "--dtype", "bf16"]) == 0
    bf16 = capsys.readouterr().out
    assert main(["info", "--dtype", "bfloat16"]) == 0
    assert capsys.readouterr().out.replace("bfloat16", "bf16") == bf16


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["program", "--summary", "--context", "-100000"], "--context: expected a non-negative integer"),
        (["generate", "--tp", "2", "--dist-timeout", "-5", "hi"], "--dist-timeout: expected a positive finite"),
        (["generate", "--tp", "2", "--dist-timeout", "nan", "hi"], "--dist-timeout: expected a positive finite"),
    ],
)
def test_values_that_can_only_fail_later_are_refused_by_the_parser(argv, message, capsys):
    assert message in _refused(argv, capsys)


def test_ctrl_c_while_the_commands_import_is_an_interruption_not_a_traceback():
    """The first second or two of any command imports torch; Ctrl-C there printed a 55-line traceback (the
    imports ran when nonstop.cli was imported, before main's error handling). A second in, a command is
    importing or running: either way Ctrl-C is "interrupted", exit 130. Sent once torch's library is mapped."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "nonstop.cli", "program", "--summary"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        # Wait for torch's library to be mapped: the command is then in Python with its handlers in place
        # (a fixed sleep on a busy host could land before the interpreter installed its SIGINT handler,
        # where the kernel's default action kills the process: exit -2, no message, as any program).
        deadline = time.monotonic() + 60
        while "libtorch" not in open(f"/proc/{proc.pid}/maps").read():
            assert proc.poll() is None and time.monotonic() < deadline, "the command never imported torch"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        err = proc.stderr.read()
        rc = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert "Traceback" not in err, err
    assert rc == 130 and "nonstop: interrupted" in err


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed interrupt itself
def test_ctrl_c_that_python_swallows_during_the_imports_still_interrupts(monkeypatch, capsys):
    """Python ignores an exception raised inside a weakref callback (as the import machinery's module locks
    run): a Ctrl-C landing there was lost and the command ran to its end. The handler notes it."""
    import gc
    import os
    import signal
    import weakref

    from nonstop import cli

    real = cli.build_parser

    def parser_with_a_swallowed_interrupt():
        class Held:
            pass

        held = Held()
        ref = weakref.ref(held, lambda r: os.kill(os.getpid(), signal.SIGINT))  # noqa: F841 (kept alive)
        del held
        gc.collect()
        return real()

    monkeypatch.setattr(cli, "build_parser", parser_with_a_swallowed_interrupt)
    assert cli.main(["info"]) == 130  # info would otherwise describe k3-nano
    assert "nonstop: interrupted" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_flags_a_command_would_ignore_are_not_offered_and_device_names_match(capsys):
    """generate renders no chat template, so it takes no --chat-template (it had loaded the file and ignored
    it); program's --device takes cuda:N as generate does (only the kind sets its defaults)."""
    err = _refused(["generate", "--chat-template", "t.jinja", "hi"], capsys)
    assert "unrecognized arguments: --chat-template" in err
    assert main(["program", "--summary", "--tp", "2", "--device", "cuda:1"]) == 0
    assert "tp 2" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--rank", "1"], "--rank describes"),
        (["--device", "cpu"], "--device describes"),
        (["--chunks", "2", "--exchange", "static"], "--chunks, --exchange describe"),
    ],
)
def test_program_refuses_rank_flags_without_a_layout(flags, named, capsys):
    """--rank / --device / --chunks / --exchange only shape one rank of a --tp / --ep layout; without one the
    single-device Program was printed and the flags were silently ignored."""
    assert named in _refused(["program", "--summary", *flags], capsys)
    assert main(["program", "--summary", "--tp", "2", *flags]) == 0
    assert "tp 2" in capsys.readouterr().out


def test_program_headline_counts_one_layer_in_the_singular(capsys):
    assert main(["program", "--summary", "--num-layers", "1"]) == 0
    assert "(kimi_k3, 1 layer, bfloat16)" in capsys.readouterr().out
    assert main(["program", "--summary", "--num-layers", "2", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "(kimi_k3, 2 layers, bfloat16)" in out and "(1 token per step)" in out


@pytest.mark.parametrize("command", ["generate", "serve"])
@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--chunks", "2"], "--chunks describes"),
        (["--exchange", "static"], "--exchange describes"),
        (["--overlap"], "--overlap describes"),
        (["--no-overlap"], "--no-overlap describes"),
        (["--dist-timeout", "5"], "--dist-timeout describes"),
        (["--chunks", "2", "--dist-timeout", "5"], "--chunks, --dist-timeout describe"),
    ],
)
def test_run_commands_refuse_layout_flags_without_a_layout(command, flags, named, capsys, monkeypatch):
    """The flags of how several ranks run do nothing in one process: generate and serve ran the single-process
    engine and ignored them. Refused before any model loads (the LLM is never built)."""
    import nonstop.engine.llm as llm_module

    def no_load(*_a, **_k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(llm_module.LLM, "__init__", no_load)
    err = _refused([command, *flags, *(["hi"] if command == "generate" else [])], capsys)
    assert named in err and "give --tp, --ep or --world above 1" in err
