"""Gaps in the tests of ``nonstop perplexity`` (``commands/perplexity.py``) found by mutation: the progress
lines on a file and on a terminal, the thread announcement, and the file errors."""

from __future__ import annotations

import copy
import re
import sys

import pytest
import torch

import nonstop.threads as threads
from nonstop.cli import main
from nonstop.commands import perplexity
from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.train.export import save_checkpoint
from tests.tiny_configs import KIMI_K3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny K3 checkpoint of 64 positions without tokenizer files (scored with --tokenizer bytes)."""
    hf = copy.deepcopy(KIMI_K3)
    hf["text_config"]["max_position_embeddings"] = 64
    m = random_model(ModelConfig.from_hf_dict(hf), torch.float32, "cpu", seed=0)
    return save_checkpoint(m, tmp_path_factory.mktemp("ppl") / "model", dtype=torch.float32)


@pytest.fixture
def text_file(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(b"abcdefghij" * 10)  # 100 byte ids: 99 scored
    return f


def _progress(err: str) -> list[tuple[int, int]]:
    return [
        (int(d.replace(",", "")), int(t.replace(",", ""))) for d, t in re.findall(r"scored ([\d,]+) / ([\d,]+)", err)
    ]


def test_progress_on_a_file_is_a_line_per_tenth_and_the_last_at_the_total(model_dir, text_file, capsys):
    """Off a terminal, progress is one line per tenth of the tokens at most, plus the total: the last line is
    99 of 99 (it must be printed even when less than a tenth came since the line before)."""
    argv = ["perplexity", "-m", str(model_dir), str(text_file), "--tokenizer", "bytes", "--context", "8"]
    assert main([*argv, "--batch-size", "1"]) == 0
    err = capsys.readouterr().err
    seen = _progress(err)
    assert seen[-1] == (99, 99) and all(t == 99 for _, t in seen)
    assert 2 <= len(seen) <= 11, seen
    assert all(b - a >= 9.9 for (a, _), (b, _) in zip(seen, seen[1:-1])), seen
    assert "\r" not in err.replace("\r  scored", "")


def test_progress_on_a_terminal_rewrites_one_line(model_dir, text_file, capsys, monkeypatch):
    """On a terminal progress rewrites one line (``\\r``, no newline) at most once a second, and ends it with a
    newline at the total. A clock that moves 2 s between reads makes every update due."""
    clock = [0.0]

    def perf_counter():
        clock[0] += 2.0
        return clock[0]

    monkeypatch.setattr(perplexity.time, "perf_counter", perf_counter)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    argv = ["perplexity", "-m", str(model_dir), str(text_file), "--tokenizer", "bytes", "--context", "8"]
    assert main([*argv, "--batch-size", "1"]) == 0
    err = capsys.readouterr().err
    updates = re.findall(r"\r  scored [^\r\n]*(\n?)", err)
    assert len(updates) >= 3, err
    assert [end for end in updates[:-1]] == [""] * (len(updates) - 1) and updates[-1] == "\n"
    assert _progress(err)[-1] == (99, 99)


def test_a_lowered_thread_count_is_announced(model_dir, text_file, capsys, monkeypatch):
    """When other processes' load lowers the default thread count, perplexity says so on stderr."""
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_chosen", None)
    monkeypatch.setattr(threads, "_default", lambda bytes_per_token=None: (1, "other processes keep 1.0 CPUs busy"))
    try:
        assert main(["perplexity", "-m", str(model_dir), str(text_file), "--tokenizer", "bytes"]) == 0
    finally:
        torch.set_num_threads(before)
    assert "nonstop: other processes keep 1.0 CPUs busy (--threads N" in capsys.readouterr().err


def test_a_missing_file_and_a_directory_are_told_apart(tmp_path):
    """A path that does not exist is "no such file"; a directory is "not a regular file"."""
    with pytest.raises(FileNotFoundError, match="nope.txt: no such file"):
        perplexity.read_text(tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError, match="not a regular file"):
        perplexity.read_text(tmp_path)


def test_a_byte_order_mark_is_not_text():
    """A leading UTF-8 byte-order mark is dropped; CRLF line ends are kept as written."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        f = Path(folder) / "bom.txt"
        f.write_bytes(b"\xef\xbb\xbfa\r\nb")
        assert perplexity.read_text(f) == "a\r\nb"
