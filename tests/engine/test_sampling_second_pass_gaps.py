"""Second-pass gaps in ``nonstop.engine.sampling``: the inclusive ends of the documented parameter ranges,
the speculative verifier's sampling distribution (min-p, top-k) against a plain-loop reference, the
greedy limit of a tiny temperature, and ``top_logprobs``' count."""

from __future__ import annotations

import math

import pytest
import torch

from nonstop.engine.sampling import (
    ADDITIVE_PENALTY_RANGE,
    REPETITION_PENALTY_RANGE,
    SamplingParams,
    sample,
    sampling_probs,
    top_logprobs,
)


def test_min_p_one_is_accepted():
    """min_p's documented range is [0, 1]: a check that turned ``<= 1`` into ``< 1`` would refuse min_p=1."""
    assert SamplingParams(min_p=1.0).min_p == 1.0


def test_repetition_penalty_smallest_is_accepted():
    """The repetition penalty's range is inclusive at float32's smallest normal (a strict ``<`` would refuse it)."""
    lo, hi = REPETITION_PENALTY_RANGE
    assert SamplingParams(repetition_penalty=lo).repetition_penalty == lo
    assert SamplingParams(repetition_penalty=hi).repetition_penalty == hi


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
def test_additive_penalties_range_is_inclusive(name):
    """presence / frequency penalties accept -2 and 2 exactly (OpenAI's and vLLM's closed range)."""
    lo, hi = ADDITIVE_PENALTY_RANGE
    assert getattr(SamplingParams(**{name: lo}), name) == lo == -2.0
    assert getattr(SamplingParams(**{name: hi}), name) == hi == 2.0


def _reference_probs(logits, temperature, top_k=-1, min_p=0.0):
    """softmax(l / T), then top-k and min-p by plain loops, renormalised (top_p = 1)."""
    vals = [float(v) / temperature for v in logits]
    m = max(vals)
    e = [math.exp(v - m) for v in vals]
    s = sum(e)
    p = [x / s for x in e]
    keep = [True] * len(p)
    if top_k > 0:
        kth = sorted(vals, reverse=True)[top_k - 1]
        keep = [k and v >= kth for k, v in zip(keep, vals)]
    if min_p > 0:
        top = max(p)
        keep = [k and x >= min_p * top for k, x in zip(keep, p)]
    kept = sum(x for x, k in zip(p, keep) if k)
    return [x / kept if k else 0.0 for x, k in zip(p, keep)]


def test_sampling_probs_applies_min_p():
    """The speculative verifier's target distribution (``sampling_probs``) must drop tokens under min_p · p_max,
    as plain sampling does; without it speculation would emit tokens plain decoding never can."""
    logits = torch.tensor([2.0, 1.5, 0.0, -1.0, 1.9])
    params = SamplingParams(temperature=1.0, min_p=0.5)
    got = sampling_probs(logits, params).tolist()
    want = _reference_probs(logits.tolist(), 1.0, min_p=0.5)
    assert got == pytest.approx(want, abs=1e-9)
    assert got[2] == 0.0 and got[3] == 0.0


def test_sampling_probs_applies_top_k():
    """``sampling_probs`` must keep only the top-k tokens (the verifier samples from it)."""
    logits = torch.tensor([0.3, 2.0, -1.0, 1.0, 0.5])
    params = SamplingParams(temperature=0.7, top_k=2)
    got = sampling_probs(logits, params).tolist()
    want = _reference_probs(logits.tolist(), 0.7, top_k=2)
    assert got == pytest.approx(want, abs=1e-9)
    assert sum(1 for x in got if x > 0) == 2


def test_tiny_temperature_is_greedy_on_ties():
    """A temperature below 1e-30 samples greedily, as on the device: the first index of a tie, every seed
    (a Gumbel draw over the tied maxima would pick either)."""
    logits = torch.tensor([0.0, 5.0, 5.0, 1.0])
    for seed in range(24):
        params = SamplingParams(temperature=1e-31, seed=seed)
        assert sample(logits, params, None, position=seed) == 1


def test_top_logprobs_returns_k_entries():
    """``logprobs=k`` returns the k most likely tokens (plus the sampled one): k = 1 must give the top token
    itself, not only the sampled one."""
    lp = torch.log_softmax(torch.tensor([0.1, 3.0, -2.0, 1.0]), -1)
    row = top_logprobs(lp, 1, 3)
    assert set(row) == {1, 3}
    assert row[1] == pytest.approx(float(lp[1]))
    assert row[3] == pytest.approx(float(lp[3]))
    assert set(top_logprobs(lp, 2, 1)) == {1, 3}


def test_top_logprobs_k_beyond_vocabulary():
    """A k larger than the vocabulary returns every token, not an error."""
    lp = torch.log_softmax(torch.tensor([0.1, 3.0, -2.0]), -1)
    row = top_logprobs(lp, 10, 0)
    assert sorted(row) == [0, 1, 2]


def test_seed_for_counts_up_from_the_seed():
    """Completion i of ``n`` samples with seed + i (mod 2^64, the Philox key's width): a sign slip would give
    completion 1 of seed s the seed of completion 1 of seed s - 2, so two requests would share samples."""
    params = SamplingParams(seed=10, n=4)
    assert [params.seed_for(i) for i in range(4)] == [10, 11, 12, 13]
    top = SamplingParams(seed=2**64 - 1, n=2)
    assert top.seed_for(1) % 2**64 == 0
    assert SamplingParams(n=2).seed_for(1) is None


def test_seed_range_ends_are_accepted():
    """Seeds span [-2^63, 2^64 - 1] inclusive (what torch.Generator.manual_seed takes)."""
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1


def test_host_sampler_applies_top_p():
    """The host sampler keeps only the smallest top set reaching top_p: logits [2, 1.9, 0, 0] give the first
    token p ~ 0.44 >= 0.3, so top_p = 0.3 keeps it alone, for every seed and position."""
    logits = torch.tensor([2.0, 1.9, 0.0, 0.0])
    for seed in range(40):
        assert sample(logits, SamplingParams(temperature=1.0, top_p=0.3, seed=seed), None, position=seed) == 0


def test_host_sampler_frequencies_follow_the_filtered_distribution():
    """Seeded draws at successive positions follow softmax(l / T) restricted by top-k and min-p (reference by
    plain loops): an unfiltered or mis-filtered draw shows in the frequencies."""
    logits = torch.tensor([1.0, 0.2, 2.0, -0.5, 1.5, 0.0])
    params = SamplingParams(temperature=0.8, top_k=4, min_p=0.2, seed=99)
    want = _reference_probs(logits.tolist(), 0.8, top_k=4, min_p=0.2)
    n = 3000
    counts = [0] * len(want)
    for pos in range(n):
        counts[sample(logits, params, None, position=pos)] += 1
    freq = [c / n for c in counts]
    assert freq == pytest.approx(want, abs=0.035)
