"""``nonstop synth`` over an old checkpoint: the files synth owns never outlive their model, a model too small
for a tokenizer is plainly tokenizer-less, and progress shows in logs (stderr not a terminal) too."""

from __future__ import annotations

import io
import json

import pytest

from nonstop.cli import main
from nonstop.engine.tokenizer import IdTokenizer, Tokenizer
from tests.tiny_configs import LLAMA


def _llama_config(tmp_path, vocab_size: int):
    path = tmp_path / f"llama{vocab_size}.json"
    path.write_text(json.dumps({**LLAMA, "vocab_size": vocab_size}))
    return str(path)


@pytest.fixture
def nano_then(tmp_path, capsys):
    """Synth k3-nano (its tokenizer, chat template and all) into a directory with user files, then a llama
    of ``vocab_size`` over it; give the directory and synth's stderr."""

    def run(vocab_size: int):
        out = tmp_path / "ckpt"
        assert main(["synth", "--preset", "k3-nano", "--num-layers", "1", "--out", str(out), "--no-preflight"]) == 0
        assert (out / "tokenizer_config.json").exists()
        (out / "notes.txt").write_text("mine")
        (out / "chat_template.jinja").write_text("{{ messages }}")
        capsys.readouterr()
        assert main(["synth", "--config", _llama_config(tmp_path, vocab_size), "--out", str(out)]) == 0
        return out, capsys.readouterr().err

    return run


def test_a_model_too_small_for_a_tokenizer_leaves_none_behind(nano_then):
    out, err = nano_then(200)
    assert not (out / "tokenizer.json").exists() and not (out / "tokenizer_config.json").exists()
    assert "removed from the old checkpoint (the new one has none): tokenizer.json, tokenizer_config.json" in err
    assert "no tokenizer" in err and "--prompt-ids" in err
    tok = Tokenizer.load(out, 200)
    assert isinstance(tok, IdTokenizer)  # not k3-nano's tokenizer, whose ids run past the vocabulary of 200
    # files synth never writes are the user's: kept, and the one the tokenizer loader reads is named
    assert (out / "notes.txt").read_text() == "mine" and (out / "chat_template.jinja").exists()
    assert "chat_template.jinja left in" in err


def test_a_byte_tokenizer_replaces_the_old_tokenizer_and_its_config(nano_then):
    out, err = nano_then(300)
    (out / "chat_template.jinja").unlink()
    assert not (out / "tokenizer_config.json").exists()  # k3-nano's chat template and <|bos|> went with it
    assert "removed from the old checkpoint (the new one has none): tokenizer_config.json" in err
    assert "no tokenizer" not in err
    tok = Tokenizer.load(out, 300)
    assert tok.chat_template is None and tok.encode("hi", add_special_tokens=False) == list(b"hi")


class _Log(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_progress_without_a_terminal_prints_a_line_every_10_seconds():
    from nonstop.commands.synth import progress_printer

    now = [0.0]
    log = _Log()
    report = progress_printer(log, clock=lambda: now[0])
    for done in range(1, 101):
        now[0] += 1.0  # one tensor a second: a line every 10 tensors, then the last count
        report(done, 100)
    lines = log.getvalue().splitlines()
    assert lines == [f"  {n}/100 tensors" for n in range(10, 101, 10)]
    assert "\r" not in log.getvalue()


def test_synth_logs_progress_when_stderr_is_not_a_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("nonstop.commands.synth.PROGRESS_EVERY_S", 0.0)  # every tensor is "10 s later"
    assert main(["synth", "--config", _llama_config(tmp_path, 300), "--out", str(tmp_path / "o")]) == 0
    counts = [ln.split()[0] for ln in capsys.readouterr().err.splitlines() if ln.endswith(" tensors")]
    total = int(counts[-1].split("/")[1])
    assert counts == [f"{n}/{total}" for n in range(1, total + 1)]
