"""`nonstop perplexity` builds only what it scores with, tokenizes only what --max-tokens needs, takes a
window its model has positions for, and says what to do about a checkpoint without a tokenizer."""

from __future__ import annotations

import copy

import pytest
import torch

import nonstop.commands.perplexity as perplexity_command
import nonstop.engine.llm as llm_module
import nonstop.engine.perplexity as perplexity
from nonstop.cli import main
from nonstop.config import ModelConfig
from nonstop.engine.tokenizer import HFTokenizer
from nonstop.model.build import random_model
from nonstop.train.export import save_checkpoint
from nonstop.weights.resolve import ASSETS
from tests.test_cli_outputs import _refused
from tests.tiny_configs import KIMI_K3

TEXT = (ASSETS / "heldout_sample.txt").read_text(encoding="utf-8")


def _scores(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith(("tokens scored", "mean NLL", "perplexity"))]


@pytest.fixture
def no_tokenizer(tmp_path):
    """A checkpoint of 64 positions with no tokenizer files."""
    hf = copy.deepcopy(KIMI_K3)
    hf["text_config"]["max_position_embeddings"] = 64
    model = random_model(ModelConfig.from_hf_dict(hf), torch.float32, "cpu", seed=0)
    return save_checkpoint(model, tmp_path / "model", dtype=torch.float32)


def test_scoring_builds_the_reference_executor_only(tmp_path, capsys, monkeypatch):
    """Scoring calls llm.model; the default (cpu) backend built and loaded C++ kernels it never used."""
    built = []
    make = llm_module.make_executor
    monkeypatch.setattr(
        llm_module, "make_executor", lambda backend, model: built.append(backend) or make(backend, model)
    )
    f = tmp_path / "t.txt"
    f.write_text(TEXT[:2000], encoding="utf-8")
    assert main(["perplexity", str(f), "--max-tokens", "50", "--context", "32"]) == 0
    assert built == ["reference"]
    assert "tokens scored: 50" in capsys.readouterr().out


def test_a_checkpoint_without_a_tokenizer_is_pointed_at_the_bytes_tokenizer(no_tokenizer, tmp_path, capsys):
    f = tmp_path / "t.txt"
    f.write_text(TEXT[:300], encoding="utf-8")
    err = _refused(["perplexity", "-m", str(no_tokenizer), str(f), "--context", "32"], capsys)
    assert "has no tokenizer" in err and "--tokenizer bytes" in err and "--prompt-ids" not in err
    assert main(["perplexity", "-m", str(no_tokenizer), str(f), "--tokenizer", "bytes", "--max-tokens", "100"]) == 0


def test_the_default_window_fits_the_models_positions(no_tokenizer, tmp_path, capsys):
    f = tmp_path / "t.txt"
    f.write_text(TEXT[:300], encoding="utf-8")
    assert main(["perplexity", "-m", str(no_tokenizer), str(f), "--tokenizer", "bytes"]) == 0
    out, err = capsys.readouterr()
    assert "context 64 |" in err and "tokens scored: 299" in out
    err = _refused(["perplexity", "-m", str(no_tokenizer), str(f), "--tokenizer", "bytes", "--context", "65"], capsys)
    assert "--context 65 exceeds the model's 64 positions" in err


def test_max_tokens_tokenizes_only_a_prefix_and_scores_the_same(tmp_path, capsys, monkeypatch):
    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    small.write_text(TEXT, encoding="utf-8")
    big.write_text(TEXT * 40, encoding="utf-8")  # 1.2M characters
    argv = ["--max-tokens", "300", "--context", "128"]
    assert main(["perplexity", str(small), *argv]) == 0
    expected = _scores(capsys.readouterr().out)
    encoded = []
    encode = HFTokenizer._encode
    monkeypatch.setattr(
        HFTokenizer, "_encode", lambda self, text, special: encoded.append(len(text)) or encode(self, text, special)
    )
    monkeypatch.setattr(perplexity_command, "LONG_TEXT_CHARS", 1000)
    assert main(["perplexity", str(big), *argv]) == 0
    out, err = capsys.readouterr()
    assert _scores(out) == expected and "its first 301 tokens read (--max-tokens)" in out
    assert max(encoded) < len(TEXT)  # the 1.2M characters were never tokenized whole
    assert f"tokenizing the first {encoded[0]:,} characters (a file of " in err


@pytest.fixture(scope="module")
def nano_encode():
    from nonstop.engine.tokenizer import Tokenizer

    return Tokenizer.load(ASSETS / "k3-nano", ModelConfig.preset("k3-nano").vocab_size, "auto").encode


@pytest.mark.parametrize("count", [1, 2, 57, 300, 1001, 7000, 7351, 7352, 10**6])
def test_leading_token_ids_are_the_whole_texts(count, nano_encode, monkeypatch):
    """Prefixes cut anywhere (from one character an id, no minimum): the ids kept are the whole text's."""
    monkeypatch.setattr(perplexity, "MIN_PREFIX_CHARS", 1)
    monkeypatch.setattr(perplexity, "FIRST_PREFIX_CHARS_PER_ID", 1)
    full = nano_encode(TEXT)
    ids, whole = perplexity.leading_token_ids(nano_encode, TEXT, count)
    assert ids == (full if whole else full[:count])
    assert whole or count < len(full)
