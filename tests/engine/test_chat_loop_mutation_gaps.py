"""``nonstop chat``'s loop as the model sees it: the prompt of every turn (the conversation so far, rendered
by the template by hand here: the tiny checkpoint's byte tokenizer makes token id = byte), /reset back to
the system message, /quit, a failed message left out of the history, CRLF line ends, the --max-tokens
bound at the edge of the context, the checkpoint's generation_config.json defaults, and a turn's speed
without the step's compile."""

from __future__ import annotations

import io
import json
import shutil

import pytest

from nonstop.cli import main
from nonstop.commands.chat import _turn_summary
from nonstop.engine.llm import LLM
from tests.engine.test_cli_generate_chat_input import _exit_code, _no_weights
from tests.engine.tiny_models import TEST_CHAT_TEMPLATE, synth_checkpoint

CONTEXT = 512  # the tiny k3 config's max_position_embeddings
SHORTEST = len("<|user|>Hi\n<|assistant|>")  # 24: the shortest turn chat checks at startup


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny k3 checkpoint (byte tokenizer, 512-token context) with a chat template."""
    return synth_checkpoint("k3", tmp_path_factory.mktemp("tiny") / "m", chat_template=TEST_CHAT_TEMPLATE)


@pytest.fixture
def turns(monkeypatch):
    """[(prompt ids, reply text)] of every turn that reached the model."""
    seen = []
    real = LLM.stream

    def stream(self, prompt, params, prompt_ids=None, **kw):
        out = real(self, prompt, params, prompt_ids=prompt_ids, **kw)
        seen.append((list(prompt_ids), out.text))
        return out

    monkeypatch.setattr(LLM, "stream", stream)
    return seen


def _ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


ARGV = ["chat", "--backend", "reference", "-n", "2", "--temperature", "0", "--ignore-eos"]


@pytest.mark.parametrize("system", ["S", ""])
def test_each_turn_sends_the_conversation_and_reset_goes_back_to_the_system_message(tiny, turns, monkeypatch, system):
    """An empty --system is a message too; replies join the history; /reset keeps the system message; CRLF
    line ends are not part of a message; /quit ends the chat (the line after it is never sent)."""
    monkeypatch.setattr("sys.stdin", io.StringIO("a\r\nb\n/reset\nc\n/quit\nd\n"))
    assert main([*ARGV, "--model", str(tiny), "--system", system]) == 0
    sys_part = f"<|system|>{system}\n"
    assert len(turns) == 3, [bytes(p) for p, _ in turns]
    r1 = turns[0][1]
    assert turns[0][0] == _ids(f"{sys_part}<|user|>a\n<|assistant|>")
    assert turns[1][0] == _ids(f"{sys_part}<|user|>a\n<|assistant|>{r1}\n<|user|>b\n<|assistant|>")
    assert turns[2][0] == _ids(f"{sys_part}<|user|>c\n<|assistant|>")


def test_a_message_that_failed_is_left_out_of_the_conversation(tiny, turns, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("a\n" + "x" * 600 + "\nb\n"))
    assert main([*ARGV, "--model", str(tiny)]) == 0
    assert "this message is too long" in capsys.readouterr().err
    assert len(turns) == 2
    assert turns[1][0] == _ids(f"<|user|>a\n<|assistant|>{turns[0][1]}\n<|user|>b\n<|assistant|>")


def test_max_tokens_that_exactly_fill_the_context_with_the_shortest_turn_are_accepted(tiny, monkeypatch, capsys):
    """The hint names the largest --max-tokens that fits (512 - 24) and that value is accepted."""
    fits = CONTEXT - SHORTEST
    with monkeypatch.context() as m:
        _no_weights(m)
        m.setattr("sys.stdin", io.StringIO("Hi\n"))
        argv = ["chat", "--model", str(tiny), "--backend", "reference", "-n", str(fits + 1)]
        assert _exit_code(argv) == 2
        err = capsys.readouterr().err
        assert f"give --max-tokens {fits} or fewer" in err and "(--max-tokens)" in err, err
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # no turn: only the startup check runs
    assert _exit_code(["chat", "--model", str(tiny), "--backend", "reference", "-n", str(fits)]) == 0
    assert "leaves no room" not in capsys.readouterr().err


def _with_generation(tiny, tmp_path, **fields):
    model = tmp_path / "m"
    shutil.copytree(tiny, model)
    path = model / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return model


def test_the_checkpoints_max_new_tokens_sets_each_reply_and_is_named_when_too_large(
    tiny, tmp_path, monkeypatch, capsys
):
    model = _with_generation(tiny, tmp_path / "three", max_new_tokens=3)
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    argv = ["chat", "--model", str(model), "--backend", "reference", "--temperature", "0", "--ignore-eos"]
    assert main(argv) == 0
    assert "[3 tokens" in capsys.readouterr().err

    model = _with_generation(tiny, tmp_path / "big", max_new_tokens=CONTEXT - SHORTEST + 1)
    _no_weights(monkeypatch)
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    assert _exit_code(["chat", "--model", str(model), "--backend", "reference"]) == 2
    err = capsys.readouterr().err
    assert "(the checkpoint's generation_config.json max_new_tokens)" in err, err


def test_a_turns_speed_without_the_compile_counts_the_tokens_after_the_first():
    """The decode interval runs from the first token to the last: 6 tokens in it are 5 steps; 2.5 s with 0.5 s
    of compiling leave 2.0 s, 2.5 tokens/s."""
    m = {"generated_tokens": 6, "decode_time_s": 2.5, "decode_tokens_per_s": 2.0, "decode_compiling_s": 0.5}
    assert _turn_summary(m) == "6 tokens, 2.0 tokens/s (2.5 without 0.5 s preparing the step)"
    assert _turn_summary({**m, "decode_compiling_s": 0.0}) == "6 tokens, 2.0 tokens/s"
    one = _turn_summary({"generated_tokens": 1, "decode_time_s": 0.0, "decode_tokens_per_s": None})
    assert one.startswith("1 token") and "/s" not in one  # one token: no decode interval, no speed


def test_a_message_too_long_beside_the_system_message_gets_no_reset_hint(tiny, monkeypatch, capsys):
    """/reset keeps the system message: a message that fits the context alone but not after a 300-character
    system message (311 + 22 + 250 prompt tokens + 2 > 512) is "this message is too long", with no hint
    that starting over would help."""
    monkeypatch.setattr("sys.stdin", io.StringIO("a\n" + "z" * 250 + "\n"))
    assert main([*ARGV, "--model", str(tiny), "--system", "s" * 300]) == 0
    err = capsys.readouterr().err
    assert "this message is too long" in err and "/reset" not in err, err
