"""Sampling filters, logprob rows and parameter checks that a mutation audit of the sampling path found untested.

Every expected value comes from the definition (hand arithmetic, OpenAI's / vLLM's documented semantics or a
brute force), never from the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nonstop.engine.requests import Request
from nonstop.engine.sampling import InvalidSamplingParam, SamplingParams, sample, sampling_probs, top_logprobs
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.model.sampling import filter_logits


def _kept(x: torch.Tensor) -> list[bool]:
    return torch.isfinite(x).tolist()


def test_top_k_one_keeps_only_the_largest_logit_and_its_ties():
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0, -4.0])
    assert _kept(filter_logits(logits, 1.0, 1, 1.0)) == [False, True, False, True, False]
    assert _kept(filter_logits(torch.tensor([0.5, 2.5, 1.0]), 0.7, 1, 1.0)) == [False, True, False]


def test_top_k_keeps_exactly_the_k_largest_and_ties_at_the_kth():
    logits = torch.tensor([0.5, 3.0, 2.0, 1.0, -1.0])
    assert _kept(filter_logits(logits, 1.0, 2, 1.0)) == [False, True, True, False, False]
    assert _kept(filter_logits(logits, 1.0, 3, 1.0)) == [False, True, True, True, False]
    tied = torch.tensor([4.0, 1.0, 2.0, 2.0, 0.0])  # the 2nd largest value is shared by ids 2 and 3
    assert _kept(filter_logits(tied, 1.0, 2, 1.0)) == [True, False, True, True, False]


def test_top_k_one_samples_the_argmax_for_any_seed():
    logits = torch.tensor([0.0, 0.1, 0.2, 0.15])  # nearly flat: without the filter other ids come up
    params = [SamplingParams(temperature=1.0, top_k=1, seed=s) for s in range(16)]
    assert {sample(logits, p, None, position=s) for s, p in enumerate(params)} == {2}


def test_top_p_just_below_one_drops_the_tail():
    # probabilities 0.99, 0.009, 0.001: 0.999 lies above id 2 (>= 0.995, dropped), 0.99 above id 1 (kept)
    logits = torch.tensor([0.99, 0.009, 0.001]).log()
    assert _kept(filter_logits(logits, 1.0, -1, 0.995)) == [True, True, False]


def test_the_host_sampler_applies_min_p():
    # p = softmax([0, -1, -5]) ~ (0.72, 0.27, 0.005): min_p = 0.2 keeps ids 0 and 1 (p >= 0.2 * 0.72 = 0.14)
    logits = torch.tensor([0.0, -1.0, -5.0])
    for T in (1.0, 3.0):
        seen = {sample(logits, SamplingParams(temperature=T, min_p=0.2, seed=s), None, position=0) for s in range(200)}
        assert seen == {0, 1}, T
    # a flat row of 8 with one token 100x less likely: min_p = 0.5 never samples it
    flat = torch.zeros(8)
    flat[5] = -math.log(100.0)
    seen = {sample(flat, SamplingParams(temperature=1.0, min_p=0.5, seed=s), None, position=s) for s in range(200)}
    assert 5 not in seen and seen == {0, 1, 2, 3, 4, 6, 7}


def test_top_logprobs_one_holds_the_most_likely_token_and_the_sampled_one():
    logprobs = torch.log_softmax(torch.tensor([0.0, 2.0, 1.0, -1.0]), dim=-1)
    want = {1: float(logprobs[1]), 3: float(logprobs[3])}
    assert top_logprobs(logprobs, 1, 3) == pytest.approx(want)
    assert top_logprobs(logprobs, 2, 1) == pytest.approx({1: float(logprobs[1]), 2: float(logprobs[2])})


def test_top_logprobs_always_hold_the_sampled_token():
    logprobs = torch.log_softmax(torch.tensor([5.0, 4.0, 3.0, -2.0]), dim=-1)
    got = top_logprobs(logprobs, 2, 3)  # id 3 is far outside the top 2
    assert set(got) == {0, 1, 3}
    assert got[3] == pytest.approx(-2.0 - math.log(math.exp(5) + math.exp(4) + math.exp(3) + math.exp(-2)))


def test_logprobs_zero_is_accepted_and_records_only_the_sampled_token():
    params = SamplingParams(temperature=0, logprobs=0, prompt_logprobs=0)
    assert params.logprobs == 0 and params.prompt_logprobs == 0
    logprobs = torch.log_softmax(torch.tensor([0.0, 1.0, 3.0]), dim=-1)
    assert top_logprobs(logprobs, 0, 0) == pytest.approx({0: float(logprobs[0])})
    req = Request("r", None, [1], params, frozenset())
    req.append(7, ByteTokenizer(256), {7: -0.5})
    assert req.logprobs == [{7: -0.5}]
    for bad in (-1, 1.0, True):
        with pytest.raises(InvalidSamplingParam):
            SamplingParams(logprobs=bad)


def test_negative_stop_token_ids_are_refused():
    with pytest.raises(InvalidSamplingParam) as info:
        SamplingParams(stop_token_ids=[3, -1])
    assert info.value.param == "stop_token_ids"
    assert SamplingParams(stop_token_ids=[0]).stop_token_ids == (0,)


def test_numpy_numbers_are_taken_as_pythons():
    params = SamplingParams(
        max_tokens=np.int64(5), top_k=np.int32(3), seed=np.uint64(2**63), n=np.int16(2), temperature=np.float32(0.5)
    )
    assert (params.max_tokens, params.top_k, params.seed, params.n) == (5, 3, 2**63, 2)
    assert type(params.max_tokens) is int and type(params.seed) is int and type(params.temperature) is float
    assert SamplingParams(stop_token_ids=[np.int64(9)]).stop_token_ids == (9,)


def test_greedy_sampling_probs_are_one_hot_at_the_argmax():
    logits = torch.tensor([0.5, 2.0, -1.0, 1.9])
    assert sampling_probs(logits, SamplingParams(temperature=0)).tolist() == [0.0, 1.0, 0.0, 0.0]
