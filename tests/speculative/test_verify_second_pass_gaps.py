"""Second-pass gaps in the speculative-sampling rule (``speculative.verify.sample_verify``): the first emitted
token must be distributed exactly as the target's p, for a deterministic (one-hot) drafter and for a
probabilistic one; checked by frequency against p, computed by hand."""

from __future__ import annotations

import pytest
import torch

from nonstop.engine.speculative.verify import greedy_verify, sample_verify

N = 4000
TOL = 0.035  # about 4.5 standard deviations of a frequency estimated from N draws


def _first_token_freq(p0: torch.Tensor, q: torch.Tensor | None, draft_token: int | None, bonus: torch.Tensor):
    """Frequencies of the first emitted token over N verifications; the draft drawn from q (or fixed)."""
    V = p0.shape[0]
    target = torch.stack([p0, bonus])
    g = torch.Generator().manual_seed(0)
    draw = torch.Generator().manual_seed(1)
    counts = torch.zeros(V)
    for _ in range(N):
        d = draft_token if q is None else int(torch.multinomial(q, 1, generator=draw))
        probs = None if q is None else q.unsqueeze(0)
        out = sample_verify([d], probs, target, g)
        counts[out[0]] += 1
    return counts / N


def test_deterministic_draft_first_token_follows_p():
    """With a one-hot draft d, the first token is d with probability p(d) and otherwise drawn from p without d:
    a rejection must never re-emit d (residual max(0, p - onehot(d)) has no mass at d)."""
    p0 = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    bonus = torch.full((4,), 0.25, dtype=torch.float64)
    freq = _first_token_freq(p0, None, 0, bonus)
    assert torch.allclose(freq, p0.float(), atol=TOL), freq.tolist()


def test_deterministic_draft_rejection_never_repeats_the_draft():
    """A one-token output (a rejection: no bonus) never holds the rejected draft token itself."""
    p0 = torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    target = torch.stack([p0, p0])
    g = torch.Generator().manual_seed(3)
    for _ in range(300):
        out = sample_verify([1], None, target, g)
        if len(out) == 1:
            assert out[0] != 1


def test_probabilistic_draft_first_token_follows_p():
    """With a draft drawn from q (a sampling drafter), acceptance is min(1, p(d) / q(d)): the first token's
    distribution is exactly p. Ignoring q (accept with p(d)) or a residual other than max(0, p - q) skews it."""
    p0 = torch.tensor([0.1, 0.6, 0.3, 0.0], dtype=torch.float64)
    q = torch.tensor([0.7, 0.1, 0.1, 0.1], dtype=torch.float64)
    bonus = torch.full((4,), 0.25, dtype=torch.float64)
    freq = _first_token_freq(p0, q, None, bonus)
    assert torch.allclose(freq, p0.float(), atol=TOL), freq.tolist()


def test_all_accepted_bonus_comes_from_the_last_row():
    """When every draft is accepted the bonus token is drawn from row k (after the last draft), not row k-1."""
    V = 5
    rows = torch.zeros(3, V, dtype=torch.float64)
    rows[0, 2] = 1.0
    rows[1, 4] = 1.0
    rows[2, 1] = 1.0
    g = torch.Generator().manual_seed(0)
    assert sample_verify([2, 4], None, rows, g) == [2, 4, 1]


def test_greedy_verify_by_hand():
    """Greedy: accept drafts while each equals the argmax of the row before it, then the argmax of the first
    unmatched row (correction) or of row k (bonus)."""
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
    assert greedy_verify([1, 0], logits) == [1, 0, 2]
    assert greedy_verify([1, 2], logits) == [1, 0]
    assert greedy_verify([2, 0], logits) == [1]


def test_residual_with_little_mass_is_still_the_residual():
    """norm(max(0, p - q)) falls back to p only when the residual has no mass at all: a small but positive
    residual (p close to q) must still be used, or a rejected draft could be emitted again."""
    from nonstop.engine.speculative.verify import residual_distribution

    p = torch.tensor([0.9995, 0.0005], dtype=torch.float64)
    q = torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert residual_distribution(p, q).tolist() == pytest.approx([0.0, 1.0])
    assert torch.equal(residual_distribution(p, p), p)
