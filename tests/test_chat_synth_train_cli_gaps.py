"""Black-box checks of `nonstop chat`, `nonstop synth` and `nonstop train` a user meets early: the chat
template against transformers' own rendering, and output directories that cannot be created."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nonstop import cli
from tests.tiny_configs import LLAMA

pytestmark = pytest.mark.timeout(120)

K3_NANO = Path(cli.__file__).parent / "assets" / "k3-nano"
UNCREATABLE = "/proc/nonstop-probe-out"  # /proc refuses mkdir even for root


def _run(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    try:
        rc = cli.main(argv)
    except SystemExit as exc:
        rc = exc.code
    return rc, capsys.readouterr().err


CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": ""},
        {"role": "user", "content": "What is a list?"},
        {"role": "assistant", "content": " A list is <|user|>\n x"},
        {"role": "user", "content": "  \u00fcn\u00efcode \u65e5\u672c \t tab  "},
    ],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "</s><s> special-looking text"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_prompt_matches_transformers_apply_chat_template(messages):
    """Catches a chat prompt (text or ids) that differs from transformers' apply_chat_template on the bundled
    k3-nano tokenizer (the independent oracle): the multi-turn history chat sends each turn."""
    transformers = pytest.importorskip("transformers")
    from nonstop.config import ModelConfig
    from nonstop.engine.chat_template import chat_prompt, chat_text
    from nonstop.engine.tokenizer import Tokenizer

    hf = transformers.AutoTokenizer.from_pretrained(str(K3_NANO))
    ours = Tokenizer.load(K3_NANO, ModelConfig.from_file(K3_NANO).vocab_size)
    want_text = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    want_ids = hf(want_text, add_special_tokens=False)["input_ids"]
    assert chat_text(ours, messages) == want_text
    assert chat_prompt(ours, messages) == list(want_ids)


def test_synth_out_that_cannot_be_created_names_out_not_free_space(tmp_path, capsys):
    # fails on base: synth says "/proc/... has 0 B free (pass --no-preflight to try anyway)", a wrong diagnosis
    """Catches `nonstop synth --out DIR` where DIR cannot be created being blamed on free disk space and sent to
    --no-preflight (which cannot help); train refuses the same --out as "cannot create the directory"."""
    cfg = tmp_path / "llama.json"
    cfg.write_text(json.dumps({**LLAMA, "vocab_size": 256}))
    rc, err = _run(["synth", "--config", str(cfg), "--out", UNCREATABLE, "--dtype", "float32"], capsys)
    assert rc == 2
    assert "no-preflight" not in err and "free" not in err, err
    assert "--out" in err and "cannot create" in err, err


def test_synth_no_preflight_out_that_cannot_be_created_names_out(tmp_path, capsys):
    # fails on base: the error is a bare "[Errno 2] No such file or directory: '/proc/...'", no flag named
    """Catches the bare OSError line for an --out that cannot be created once the preflight is skipped."""
    cfg = tmp_path / "llama.json"
    cfg.write_text(json.dumps({**LLAMA, "vocab_size": 256}))
    argv = ["synth", "--config", str(cfg), "--out", UNCREATABLE, "--dtype", "float32", "--no-preflight"]
    rc, err = _run(argv, capsys)
    assert rc == 2
    assert err.count("\n") == 1 and "--out" in err and "cannot create" in err, err


@pytest.mark.parametrize("flag", ["--out", "--cache-dir"])
def test_train_output_that_cannot_be_created_is_refused_before_any_work(tmp_path, capsys, flag):
    """Holds on base: train names the flag and refuses before tokenizing (no corpus is even needed)."""
    argv = ["train", "--out", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c"), "--corpus", str(tmp_path)]
    argv[argv.index(flag) + 1] = UNCREATABLE
    rc, err = _run(argv, capsys)
    assert rc == 2
    want = f"nonstop: error: {flag} {UNCREATABLE}: cannot create the directory (No such file or directory)"
    assert err.strip() == want


def test_train_min_lr_above_lr_is_refused(tmp_path, capsys):
    """Holds on base: a schedule whose floor is above its peak is one error line, before any tokenizing."""
    argv = ["train", "--out", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c"), "--lr", "1e-3"]
    rc, err = _run([*argv, "--min-lr", "2e-3"], capsys)
    assert rc == 2 and err.strip() == "nonstop: error: --min-lr 0.002 is above the peak --lr 0.001"


def _chat(argv: list[str], stdin: bytes, capsys, monkeypatch) -> tuple[int, str, str]:
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    capsys.readouterr()
    try:
        rc = cli.main(["chat", "--backend", "reference", *argv])
    except SystemExit as exc:
        rc = exc.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_chat_input_with_only_invalid_lines_exits_non_zero(capsys, monkeypatch):
    """Holds on base: each undecodable line is reported alone; none answered is exit status 2, no traceback."""
    rc, out, err = _chat(["-n", "2"], b"a\xff\n\xfe\n", capsys, monkeypatch)
    assert rc == 2 and out == ""
    assert "input line 1 is not valid utf-8 (byte 0xff at position 2): not sent" in err
    assert "input line 2 is not valid utf-8 (byte 0xfe at position 1): not sent" in err
    assert "none of the 2 message(s) got a reply" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["/exit", "  /quit  "])
def test_chat_exit_command_stops_before_later_lines(capsys, monkeypatch, command):
    """Holds on base: /exit and /quit (surrounding blanks allowed) end the session; the next line gets no reply."""
    rc, out, err = _chat(["-n", "2"], f"{command}\nHello\n".encode(), capsys, monkeypatch)
    assert rc == 0 and out == ""
    assert "tokens" not in err  # no turn summary line: nothing was generated


def test_chat_turn_prompts_match_transformers_with_history_and_reset(capsys, monkeypatch):
    """Catches a turn prompt that drops or doubles the history, keeps it across /reset, or loses --system: the
    ids sent each turn equal transformers' apply_chat_template of the conversation so far (replies as
    generated)."""
    transformers = pytest.importorskip("transformers")
    import nonstop.commands.chat as chat

    sent = []
    real = chat.stream_text

    def spy(llm, params, ids):
        out = real(llm, params, ids)
        sent.append((list(ids), out.text))
        return out

    monkeypatch.setattr(chat, "stream_text", spy)
    argv = ["-n", "4", "--temperature", "0", "--system", "Be brief."]
    rc, _, _ = _chat(argv, b"What is a list?\nAnd a dict?\n/reset\nThird\n", capsys, monkeypatch)
    assert rc == 0 and len(sent) == 3
    hf = transformers.AutoTokenizer.from_pretrained(str(K3_NANO))
    system = [{"role": "system", "content": "Be brief."}]
    first = {"role": "user", "content": "What is a list?"}
    conversations = [
        [*system, first],
        [*system, first, {"role": "assistant", "content": sent[0][1]}, {"role": "user", "content": "And a dict?"}],
        [*system, {"role": "user", "content": "Third"}],
    ]
    for (ids, _), messages in zip(sent, conversations):
        text = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert ids == list(hf(text, add_special_tokens=False)["input_ids"])
