"""`nonstop perplexity` scores a file's bytes as written (CRLF line ends too), refuses a --batch-size whose
logits do not fit in memory (before scoring, or when a forward's allocation fails) by naming the flags to
lower, and offers --tokenizer bytes only to a checkpoint whose vocabulary holds every byte value."""

from __future__ import annotations

import copy

import pytest
import torch

import nonstop.engine.perplexity as perplexity
import nonstop.program.preflight as preflight
from nonstop.cli import main
from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.train.export import save_checkpoint
from tests.test_cli_outputs import _refused
from tests.tiny_configs import KIMI_K3

POSITIONS = 64


def _checkpoint(path, vocab_size: int | None = None):
    """A tiny K3 checkpoint of 64 positions without tokenizer files (``vocab_size`` ids if given)."""
    hf = copy.deepcopy(KIMI_K3)
    hf["text_config"]["max_position_embeddings"] = POSITIONS
    if vocab_size is not None:
        hf["text_config"]["vocab_size"] = vocab_size
    model = random_model(ModelConfig.from_hf_dict(hf), torch.float32, "cpu", seed=0)
    return save_checkpoint(model, path, dtype=torch.float32)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return _checkpoint(tmp_path_factory.mktemp("ppl") / "model")


@pytest.fixture
def scored_ids(monkeypatch):
    """The ids each ``score_token_ids`` call of the command is given (it then scores them as usual)."""
    calls = []
    score = perplexity.score_token_ids
    monkeypatch.setattr(
        perplexity, "score_token_ids", lambda model, ids, **kw: calls.append(list(ids)) or score(model, ids, **kw)
    )
    return calls


@pytest.mark.parametrize(
    "raw",
    [b"ab\r\ncd\r\nef\r\n", b"\xef\xbb\xbfab\r\ncd\r\n", b"one\rtwo\r\n\r\nthree\n"],
    ids=["crlf", "bom-crlf", "lone-cr"],
)
def test_line_ends_are_scored_as_written(model_dir, tmp_path, capsys, scored_ids, raw):
    """read_text() turned each \\r\\n into \\n: a CRLF file of 12 bytes was scored as 9 tokens."""
    f = tmp_path / "t.txt"
    f.write_bytes(raw)
    text = raw.removeprefix(b"\xef\xbb\xbf")  # the byte-order mark is not text
    assert main(["perplexity", "-m", str(model_dir), str(f), "--tokenizer", "bytes"]) == 0
    out = capsys.readouterr().out
    assert scored_ids == [list(text)]
    assert f"({len(text)} tokens)" in out and f"tokens scored: {len(text) - 1}" in out


def test_the_max_tokens_prefix_keeps_carriage_returns(model_dir, tmp_path, capsys, scored_ids, monkeypatch):
    """--max-tokens tokenizes prefixes of the text (here cut from one character an id): the same bytes."""
    monkeypatch.setattr(perplexity, "MIN_PREFIX_CHARS", 1)
    monkeypatch.setattr(perplexity, "FIRST_PREFIX_CHARS_PER_ID", 1)
    raw = b"line\r\n" * 50
    f = tmp_path / "t.txt"
    f.write_bytes(raw)
    assert main(["perplexity", "-m", str(model_dir), str(f), "--tokenizer", "bytes", "--max-tokens", "20"]) == 0
    assert "its first 21 tokens read" in capsys.readouterr().out
    assert scored_ids == [list(raw[:21])]


@pytest.mark.parametrize(
    ("tokens", "context", "batch_size"), [(1, 8, 4), (7, 8, 4), (40, 8, 3), (40, 8, 9), (41, 5, 2)]
)
def test_largest_forward_is_the_largest_forward_scoring_runs(tokens, context, batch_size):
    shapes = []

    class Recorder(torch.nn.Module):
        def forward(self, input_ids):
            shapes.append(tuple(input_ids.shape))
            return torch.zeros(*input_ids.shape, 11)

    perplexity.score_token_ids(Recorder(), [i % 11 for i in range(tokens + 1)], context=context, batch_size=batch_size)
    windows, window = perplexity.largest_forward(tokens, context, batch_size)
    biggest = max(shapes, key=lambda s: s[0] * s[1])
    assert biggest[0] * biggest[1] == windows * window and biggest[1] == window
    assert perplexity.logits_bytes(windows, window, 11) == 2 * 4 * 11 * windows * window  # logits + log-softmax


def _big_batch(model_dir, tmp_path, *extra) -> list[str]:
    f = tmp_path / "t.txt"
    f.write_bytes(b"0123456789abcdef" * 256)  # 4,096 bytes: 63 full windows of 64
    return ["perplexity", "-m", str(model_dir), str(f), "--tokenizer", "bytes", "--batch-size", "50", *extra]


def test_logits_beyond_the_free_memory_are_refused_before_scoring(model_dir, tmp_path, capsys, scored_ids, monkeypatch):
    """A forward of 50 windows of 64 tokens holds two fp32 [50, 64, 301] tensors (logits and log-softmax):
    with room for one of them only, nothing is scored and the flags to lower are named."""
    one_copy = 50 * 64 * 301 * 4
    monkeypatch.setattr(preflight, "available_memory", lambda device: one_copy)
    err = _refused(_big_batch(model_dir, tmp_path), capsys)
    assert "lower --batch-size (now 50) or --context (now 64)" in err and "--no-preflight" in err
    assert len(err.strip().splitlines()) == 1 and scored_ids == []
    monkeypatch.setattr(preflight, "available_memory", lambda device: 3 * one_copy)
    assert main(_big_batch(model_dir, tmp_path)) == 0
    assert "tokens scored: 4095" in capsys.readouterr().out


def test_a_small_file_is_not_refused_for_a_batch_it_never_fills(model_dir, tmp_path, capsys, monkeypatch):
    """Only the windows the file has are counted: 3 windows, not --batch-size 50 of them."""
    monkeypatch.setattr(preflight, "available_memory", lambda device: 4 * 3 * 64 * 301 * 4)
    f = tmp_path / "t.txt"
    f.write_bytes(b"x" * (3 * 64 + 1))
    assert main(["perplexity", "-m", str(model_dir), str(f), "--tokenizer", "bytes", "--batch-size", "50"]) == 0


def test_an_allocation_that_fails_in_a_forward_names_the_flags(model_dir, tmp_path, capsys, monkeypatch):
    """torch's CPU allocator raises a RuntimeError: it was reported as an internal error (a bug)."""

    def no_memory(model, windows):
        torch.empty(1 << 60, dtype=torch.uint8)  # an exabyte: the allocator's own error

    monkeypatch.setattr(perplexity, "window_nll", no_memory)
    err = _refused(_big_batch(model_dir, tmp_path, "--no-preflight"), capsys)
    assert "out of memory scoring 50 window(s) of 64 tokens" in err
    assert "lower --batch-size (now 50) or --context (now 64)" in err and len(err.strip().splitlines()) == 1


def test_other_runtime_errors_stay_internal_errors(model_dir, tmp_path, capsys, monkeypatch):
    def broken(model, windows):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(perplexity, "window_nll", broken)
    with pytest.raises(SystemExit) as e:
        main(_big_batch(model_dir, tmp_path))
    assert e.value.code == 1 and "internal error: RuntimeError: shape mismatch" in capsys.readouterr().err


def test_bytes_are_offered_only_to_a_vocabulary_that_holds_every_byte(tmp_path, capsys):
    small = _checkpoint(tmp_path / "small", vocab_size=200)
    f = tmp_path / "t.txt"
    f.write_text("some text", encoding="utf-8")
    err = _refused(["perplexity", "-m", str(small), str(f)], capsys)
    assert "has no tokenizer" in err and "add the tokenizer files" in err
    assert "give --tokenizer bytes" not in err and "vocabulary of 200 ids" in err
