"""``nonstop chat`` edges: lines of only spaces or tabs are skipped (never sent to the model), commands
surrounded by spaces still act as commands, the startup room check counts the system message, and a turn
whose decode was all compiling gets no rate "without" it."""

from __future__ import annotations

import io

import pytest

from nonstop.cli import main
from tests.engine.test_chat_loop_mutation_gaps import ARGV, tiny, turns  # noqa: F401 - fixtures


@pytest.fixture
def prompts(turns):  # noqa: F811 - the imported fixture
    """The prompt (as text: the byte tokenizer's id = byte) of every turn that reached the model."""

    class Texts:
        def __eq__(self, other):
            return [bytes(ids).decode("utf-8") for ids, _ in turns] == other

    return Texts()


def test_whitespace_only_lines_are_not_sent(tiny, prompts, monkeypatch):  # noqa: F811
    """Lines of spaces / a tab are skipped like empty lines (sending them would spend a turn on an empty
    message and put it in the history); the one real message is sent alone."""
    monkeypatch.setattr("sys.stdin", io.StringIO("   \n\t\n\nhi\n"))
    assert main([*ARGV, "--model", str(tiny)]) == 0
    assert prompts == ["<|user|>hi\n<|assistant|>"]


def test_commands_with_surrounding_spaces_still_work(tiny, prompts, monkeypatch, capsys):  # noqa: F811
    """'  /reset ' clears the conversation and ' /quit  ' ends the chat (the line after it is never sent)."""
    monkeypatch.setattr("sys.stdin", io.StringIO("a\n  /reset \nb\n /quit  \nc\n"))
    assert main([*ARGV, "--model", str(tiny)]) == 0
    assert prompts == ["<|user|>a\n<|assistant|>", "<|user|>b\n<|assistant|>"]
    assert "(conversation cleared)" in capsys.readouterr().err


def test_a_turn_that_was_all_compiling_gives_no_rate_without_it():
    """decode_compiling_s equal to the whole decode time leaves no decode time to divide by: the summary gives
    the plain speed only (not a ZeroDivisionError, nor a negative rate when the compile is counted larger)."""
    from nonstop.commands.chat import _turn_summary

    m = {"generated_tokens": 3, "decode_tokens_per_s": 1.0, "decode_time_s": 2.0, "decode_compiling_s": 2.0}
    assert _turn_summary(m) == "3 tokens, 1.0 tokens/s"
    assert _turn_summary({**m, "decode_compiling_s": 2.5}) == "3 tokens, 1.0 tokens/s"


def _exit_code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_the_startup_room_check_counts_the_system_message(tiny, monkeypatch, capsys):  # noqa: F811
    """The shortest turn is the system message plus "Hi": with --system of 100 characters it takes
    len("<|system|>" + 100·"S" + "\\n<|user|>Hi\\n<|assistant|>") = 135 tokens, so --max-tokens 400 leaves no
    room in the 512-token context (135 + 400 > 512) and is refused at startup, naming 512 - 135 = 377; leaving
    the system message out of the check (24 + 400 fits) would accept it and fail every turn instead."""
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    argv = [*ARGV, "--model", str(tiny), "--system", "S" * 100, "--max-tokens", "400"]
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert "the shortest takes 135 prompt tokens" in err and "--max-tokens 377 or fewer" in err
    assert _exit_code([*argv[:-1], "377"]) == 0


def test_a_system_message_that_fills_the_context_is_not_offered_a_max_tokens(tiny, monkeypatch, capsys):  # noqa: F811
    """A --system of 600 characters alone takes more than the 512-token context: no --max-tokens fits, so the
    refusal names the system prompt rather than offering '--max-tokens 1 or fewer', which fails too."""
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    argv = [*ARGV, "--model", str(tiny), "--system", "S" * 600, "--max-tokens", "1"]
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert "the shortest takes 635 prompt tokens" in err and "shorten the system prompt (--system)" in err, err
    assert "or fewer" not in err
