"""Verification rules: greedy emits plain greedy decoding's tokens; speculative sampling reproduces
the target distribution exactly (chi-square over many draws, tiny vocabulary), with deterministic
drafts (one-hot q) and with sampled drafts (a full q), including zero-probability corner cases."""

from __future__ import annotations

import itertools

import pytest
import torch

from nonstop.engine.sampling import SamplingParams
from nonstop.engine.speculative.verify import greedy_verify, residual_distribution, sample_verify, verify
from tests.speculative.stats import chi_square_pvalue


def logits_with_argmax(tops: list[int], V: int = 7) -> torch.Tensor:
    x = torch.randn(len(tops), V, generator=torch.Generator().manual_seed(0))
    for i, t in enumerate(tops):
        x[i, t] = 10.0
    return x


def test_greedy_all_accepted_gives_bonus():
    assert greedy_verify([3, 1, 4], logits_with_argmax([3, 1, 4, 6])) == [3, 1, 4, 6]


def test_greedy_first_rejected_gives_correction():
    assert greedy_verify([2, 1, 4], logits_with_argmax([3, 1, 4, 6])) == [3]


def test_greedy_partial():
    assert greedy_verify([3, 1, 5], logits_with_argmax([3, 1, 4, 6])) == [3, 1, 4]


def test_greedy_zero_drafts():
    assert greedy_verify([], logits_with_argmax([5])) == [5]
    assert verify([], None, logits_with_argmax([5]), SamplingParams(temperature=0), None) == [5]


def test_residual_falls_back_to_target_without_mass():
    p = torch.tensor([0.25, 0.75])
    assert torch.equal(residual_distribution(p, p.clone()), p)


def test_rejected_deterministic_draft_is_never_redrawn():
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]])
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        out = sample_verify([0], None, p, g)
        if len(out) == 1:  # rejected: the replacement is never the draft
            assert out[0] != 0


def test_impossible_draft_is_always_rejected():
    p = torch.tensor([[0.6, 0.4, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    g = torch.Generator().manual_seed(1)
    assert all(len(sample_verify([2], None, p, g)) == 1 for _ in range(200))


# ----------------------------------------------------------------------------- exact distribution

V = 4
K = 3  # drafts per step: the emitted block covers 1..4 tokens


def markov(seed: int, sharp: float) -> torch.Tensor:
    """A random transition matrix [V, V] (row = previous token)."""
    return torch.softmax(sharp * torch.randn(V, V, generator=torch.Generator().manual_seed(seed)), dim=-1)


TARGET = markov(10, 1.5)
DRAFT = markov(11, 1.5)  # a different chain: many rejections


def exact_joint(first: int, length: int) -> torch.Tensor:
    """P(x_1..x_length | x_0 = first) under TARGET, flattened in itertools.product order."""
    out = []
    for seq in itertools.product(range(V), repeat=length):
        prob, prev = 1.0, first
        for t in seq:
            prob *= float(TARGET[prev, t])
            prev = t
        out.append(prob)
    return torch.tensor(out)


def run_block(first: int, draft_mode: str, g: torch.Generator) -> list[int]:
    """One speculative step from x_0 = first: K drafts, then verification against TARGET rows."""
    tokens, probs, prev = [], [], first
    for _ in range(K):
        if draft_mode == "sampled":
            q = DRAFT[prev]
            prev = int(torch.multinomial(q, 1, generator=g))
            probs.append(q)
        else:  # deterministic: the draft chain's argmax (q one-hot)
            prev = int(DRAFT[prev].argmax())
        tokens.append(prev)
    context = [first] + tokens
    target = torch.stack([TARGET[t] for t in context])  # row i: after context[i]
    return sample_verify(tokens, torch.stack(probs) if probs else None, target, g)


@pytest.mark.parametrize("draft_mode", ["sampled", "deterministic"])
def test_speculative_sampling_reproduces_the_target(draft_mode):
    """Generate 3 tokens per sample with speculative steps (each step emits 1..K+1 tokens, chained
    until 3 exist) and compare the joint distribution of the 3 tokens with the target's."""
    g = torch.Generator().manual_seed(1234)
    length, n = 3, 20000
    counts = torch.zeros(V**length)
    lengths = []
    for _ in range(n):
        seq = []
        while len(seq) < length:
            emitted = run_block(seq[-1] if seq else 0, draft_mode, g)
            lengths.append(len(emitted))
            seq += emitted
        idx = 0
        for t in seq[:length]:
            idx = idx * V + t
        counts[idx] += 1
    p = chi_square_pvalue(counts, exact_joint(0, length))
    assert p > 1e-3, f"speculative samples do not follow the target (chi-square p = {p:.2e})"
    assert 1.0 < sum(lengths) / len(lengths) < K + 1  # some accepted, some rejected


def test_position_wise_marginals_with_top_p_target():
    """Against a filtered (top-p) target the emitted token after an accepted draft is still exact:
    the first emitted token's distribution equals the nucleus distribution."""
    from nonstop.engine.sampling import sampling_probs

    params = SamplingParams(temperature=0.7, top_p=0.8)
    logits = torch.randn(2, 6, generator=torch.Generator().manual_seed(5))
    target = torch.stack([sampling_probs(row, params) for row in logits])
    g = torch.Generator().manual_seed(9)
    counts = torch.zeros(6)
    n = 20000
    for _ in range(n):
        out = verify([int(logits[0].argmax())], None, logits, params, g)
        counts[out[0]] += 1
    assert chi_square_pvalue(counts, target[0]) > 1e-3
