"""`nonstop chat` says what is wrong: a later message too long by itself is "this message is too long"
(starting over would not help, so no /reset hint), and an empty --chat-template file is called empty, not
a model without a template."""

from __future__ import annotations

import io

import pytest

from tests.engine.test_cli_generate_chat_input import _exit_code, _no_weights
from tests.engine.tiny_models import TEST_CHAT_TEMPLATE, synth_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny k3 checkpoint (byte tokenizer, 512-token context) with a chat template."""
    return synth_checkpoint("k3", tmp_path_factory.mktemp("tiny") / "m", chat_template=TEST_CHAT_TEMPLATE)


ARGV = ["chat", "--backend", "reference", "-n", "100", "--temperature", "0", "--ignore-eos"]


@pytest.mark.parametrize("system", [None, "be brief"])
def test_a_later_message_too_long_by_itself_gets_no_reset_hint(tiny, monkeypatch, capsys, system):
    """After one reply, a message that alone (with the system message) leaves no room for 100 tokens in the
    512 of the context was "the conversation is too long ... (/reset starts over)": /reset then failed too."""
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n" + "x" * 450 + "\n"))
    extra = [] if system is None else ["--system", system]
    assert _exit_code([*ARGV, "--model", str(tiny), *extra]) == 0  # the first message got its reply
    err = capsys.readouterr().err
    assert "this message is too long" in err and "/reset" not in err and "conversation is too long" not in err


def test_a_later_message_that_fits_alone_keeps_the_reset_hint(tiny, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("y" * 200 + "\n" + "z" * 200 + "\n"))
    assert _exit_code([*ARGV, "--model", str(tiny)]) == 0
    err = capsys.readouterr().err
    assert "the conversation is too long" in err and "(/reset starts over)" in err


def test_an_empty_chat_template_file_is_called_empty(tiny, tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty.jinja"
    empty.write_text("")
    _no_weights(monkeypatch)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))
    assert _exit_code(["chat", "--model", str(tiny), "--backend", "reference", "--chat-template", str(empty)]) == 2
    err = capsys.readouterr().err
    assert f"--chat-template {empty} is empty" in err and "has no chat template" not in err
    assert len(err.strip().splitlines()) == 1
