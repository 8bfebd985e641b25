"""Pearson's chi-square goodness-of-fit for the speculative-sampling tests."""

from __future__ import annotations

import torch


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of observed ``counts`` [N] under ``probs`` [N] (sum 1). Cells expected below
    ``min_expected`` are pooled into one; P(X > x) for X ~ chi²(df) is the regularised upper gamma."""
    counts, probs = counts.double(), probs.double()
    n = counts.sum()
    expected = probs * n
    small = expected < min_expected
    obs = torch.cat([counts[~small], counts[small].sum()[None]]) if small.any() else counts
    exp = torch.cat([expected[~small], expected[small].sum()[None]]) if small.any() else expected
    keep = exp > 0
    if bool((obs[~keep] > 0).any()):
        return 0.0  # an outcome of probability 0 was observed
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))
