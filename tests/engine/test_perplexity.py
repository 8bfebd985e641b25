"""The perplexity scorer: every token after the first is predicted once, from its window."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nonstop.config import ModelConfig
from nonstop.engine.perplexity import score_token_ids
from nonstop.model.build import random_model
from tests.tiny_configs import KIMI_K3

CFG = ModelConfig.from_hf_dict(KIMI_K3)


def test_perplexity_windows_score_every_token_once():
    model = random_model(CFG, seed=2)
    ids = torch.randint(0, CFG.vocab_size, (50,))
    with torch.no_grad():
        whole = F.cross_entropy(model(ids[None, :-1])[0], ids[1:], reduction="sum").item()
        windows = sum(
            F.cross_entropy(model(ids[None, s : s + 17][:, :-1])[0], ids[s + 1 : s + 17], reduction="sum").item()
            for s in range(0, 49, 16)
        )
    one = score_token_ids(model, ids, context=64)
    assert one.tokens == 49 and one.total_nll == pytest.approx(whole, rel=1e-5)
    cut = score_token_ids(model, ids, context=16, batch_size=2)
    assert cut.tokens == 49 and cut.total_nll == pytest.approx(windows, rel=1e-5)
    assert score_token_ids(model, ids, context=16, max_tokens=20).tokens == 20
    with pytest.raises(ValueError):
        score_token_ids(model, ids[:1])
