"""Perplexity behaviours a mutation audit found unpinned: the mean NLL and perplexity against plain torch, a
window that is not positive refused, progress that ends at the total and never passes it, a --context equal
to the model's positions accepted, the --max-tokens note and memory check, and --tokenizer bytes offered to a
vocabulary of exactly 256 ids."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import nonstop.program.preflight as preflight
from nonstop.cli import main
from nonstop.commands.perplexity import no_tokenizer_message, scoring_context
from nonstop.config import ModelConfig
from nonstop.engine.perplexity import score_token_ids
from nonstop.model.build import random_model
from nonstop.train.export import save_checkpoint
from tests.tiny_configs import KIMI_K3

CFG = ModelConfig.from_hf_dict(KIMI_K3)
POSITIONS = 64


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, torch.float32, "cpu", seed=3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny K3 checkpoint of 64 positions without tokenizer files (scored with --tokenizer bytes)."""
    hf = copy.deepcopy(KIMI_K3)
    hf["text_config"]["max_position_embeddings"] = POSITIONS
    m = random_model(ModelConfig.from_hf_dict(hf), torch.float32, "cpu", seed=0)
    return save_checkpoint(m, tmp_path_factory.mktemp("ppl") / "model", dtype=torch.float32)


def test_mean_nll_and_perplexity_are_those_of_plain_torch(model):
    ids = torch.randint(0, CFG.vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mean = F.cross_entropy(model(ids[None, :-1])[0], ids[1:]).item()  # one window: every id after the first
    result = score_token_ids(model, ids, context=64)
    assert result.tokens == 39
    assert result.mean_nll == pytest.approx(mean, rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(mean), rel=1e-5)


@pytest.mark.parametrize("context", [0, -3])
def test_a_window_that_is_not_positive_is_refused(model, context):
    with pytest.raises(ValueError, match="context must be positive"):
        score_token_ids(model, list(range(10)), context=context)


def test_progress_rises_to_the_total_and_never_passes_it(model):
    """49 ids to score in windows of 16: 3 full windows (48 ids) in batches of 2, then the last id alone."""
    calls = []
    score_token_ids(model, list(range(50)), context=16, batch_size=2, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(32, 49), (48, 49), (49, 49)]


def test_a_context_of_exactly_the_models_positions_is_accepted():
    assert scoring_context(POSITIONS, POSITIONS) == POSITIONS
    assert scoring_context(None, POSITIONS) == POSITIONS  # the default 512 capped at the positions
    with pytest.raises(ValueError, match="exceeds the model's 64 positions"):
        scoring_context(POSITIONS + 1, POSITIONS)


def test_bytes_are_offered_to_a_vocabulary_of_exactly_256_ids():
    assert "give --tokenizer bytes" in no_tokenizer_message("m", 256)
    assert "give --tokenizer bytes" not in no_tokenizer_message("m", 255)


def test_the_file_line_says_how_many_tokens_max_tokens_read(model_dir, tmp_path, capsys):
    f = tmp_path / "t.txt"
    f.write_bytes(b"abcdefghij" * 10)  # 100 byte ids
    assert main(["perplexity", "-m", str(model_dir), str(f), "--tokenizer", "bytes", "--max-tokens", "10"]) == 0
    out = capsys.readouterr().out
    assert f"file: {f} (100 tokens, the first 11 read (--max-tokens))" in out and "tokens scored: 10" in out
    assert main(["perplexity", "-m", str(model_dir), str(f), "--tokenizer", "bytes", "--max-tokens", "500"]) == 0
    out = capsys.readouterr().out
    assert f"file: {f} (100 tokens)\n" in out and "tokens scored: 99" in out


def test_the_memory_check_counts_only_the_windows_max_tokens_scores(model_dir, tmp_path, capsys, monkeypatch):
    """--max-tokens 64 of a 4096-id file is one window of 64 (two fp32 logit copies: 154 KB): 1 MB (the weights
    need about 0.7 MB) is enough, though the whole file in batches of 50 windows would need 7.7 MB."""
    monkeypatch.setattr(preflight, "available_memory", lambda device: 1 << 20)
    f = tmp_path / "t.txt"
    f.write_bytes(b"y" * 4096)
    argv = ["perplexity", "-m", str(model_dir), str(f), "--tokenizer", "bytes", "--batch-size", "50"]
    assert main([*argv, "--max-tokens", "64"]) == 0
    assert "tokens scored: 64" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # the whole file: 50 windows a forward do not fit
        main(argv)
    assert "lower --batch-size (now 50)" in capsys.readouterr().err
