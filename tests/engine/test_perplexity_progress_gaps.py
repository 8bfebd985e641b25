"""Perplexity scoring bookkeeping: the progress reported when the context exceeds the ids, and the size of
the largest forward (what the logits memory preflight checks), by hand arithmetic."""

from __future__ import annotations

import torch

from nonstop.engine.perplexity import largest_forward, score_token_ids


def _uniform_model(vocab: int):
    return lambda x: torch.zeros(*x.shape, vocab)


def test_progress_never_passes_the_total_when_the_context_exceeds_the_ids():
    """5 ids (4 scored) with context 512: one window of 4 tokens, progress (4, 4) only (not 512 of 4); the
    uniform model's NLL is 4·ln 8."""
    calls = []
    result = score_token_ids(
        _uniform_model(8), [1, 2, 3, 4, 5], context=512, progress=lambda d, t: calls.append((d, t))
    )
    assert calls == [(4, 4)]
    assert result.tokens == 4 and abs(result.total_nll - 4 * torch.log(torch.tensor(8.0)).item()) < 1e-5


def test_largest_forward_counts_only_full_windows():
    """10 ids scored in windows of 4, 4 a forward: 2 full windows run together (the partial one of 2 runs
    alone), so the largest forward is (2, 4), not 3 windows; 3 ids with context 8: one window of 3."""
    assert largest_forward(10, 4, 4) == (2, 4)
    assert largest_forward(3, 8, 4) == (1, 3)
    assert largest_forward(0, 8, 4) == (0, 0)
