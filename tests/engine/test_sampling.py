"""Sampling math at the edges (any finite temperature / top_p), min_p and the penalties against
independent definitions (transformers' processors, OpenAI's formula), and n / penalties through LLM."""

from __future__ import annotations

import math

import pytest
import torch

from nonstop import LLM, SamplingParams
from nonstop.config import ModelConfig
from nonstop.engine.sampling import InvalidSamplingParam, sample
from nonstop.model.sampling import filter_logits, penalize
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import KIMI_K3

TEMPERATURES = [5e-324, 1e-300, 1e-30, 1e-5, 0.3, 1.0, 7.0, 1e5, 1e300]


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("top_p", [5e-324, 1e-46, 0.3, 1.0])
def test_any_finite_temperature_and_top_p_give_a_distribution(temperature, top_p):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(257, generator=gen) * 8
    logits[17] = logits.max() + 0.5  # a clear argmax
    probs = torch.softmax(filter_logits(logits, temperature, -1, top_p), -1)
    assert torch.isfinite(probs).all() and math.isclose(float(probs.sum()), 1.0, rel_tol=1e-9)
    if temperature <= 1e-30 or top_p < 1e-40:
        assert int(probs.argmax()) == 17 and float(probs[17]) == 1.0
    token = sample(logits, SamplingParams(temperature=temperature, top_p=top_p), torch.Generator().manual_seed(0))
    assert 0 <= token < 257


def test_huge_temperature_flattens_and_ties_survive_tiny_ones():
    logits = torch.tensor([3.0, 1.0, 3.0, -2.0])
    assert torch.allclose(
        torch.softmax(filter_logits(logits, 1e300, -1, 1.0), -1).double(), torch.full((4,), 0.25, dtype=torch.float64)
    )
    tied = torch.softmax(filter_logits(logits, 1e-300, -1, 1.0), -1)
    assert tied.tolist() == [0.5, 0.0, 0.5, 0.0]


@pytest.mark.parametrize("min_p", [0.0, 0.01, 0.2, 0.7, 1.0])
def test_min_p_keeps_tokens_at_least_min_p_times_the_most_likely(min_p):
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(300, generator=gen) * 3
    for temperature in (0.5, 1.0, 1.7):
        p = torch.softmax(logits.double() / temperature, -1)
        want = p >= min_p * p.max()
        kept = torch.isfinite(filter_logits(logits, temperature, -1, 1.0, min_p))
        assert torch.equal(kept, want)


def test_repetition_penalty_equals_transformers():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(1, 50, generator=gen) * 2
    history = torch.tensor([[3, 7, 7, 20, 49, 0]])
    for r in (0.5, 1.0, 1.3, 2.0):
        want = RepetitionPenaltyLogitsProcessor(r)(history, logits.clone())[0]
        seen = history[0].unique()
        got = penalize(logits[0], seen, torch.empty(0, dtype=torch.long), torch.empty(0), repetition=r)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_presence_and_frequency_penalties_follow_openai():
    """mu[j] -> mu[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence (OpenAI's API reference)."""
    logits = torch.linspace(-2, 2, 12)
    output = [4, 4, 4, 9, 11, 4]
    counts = torch.bincount(torch.tensor(output), minlength=12).double()
    for a_pres, a_freq in ((0.0, 0.0), (0.5, 0.0), (0.0, 0.3), (-1.0, 1.5)):
        want = logits.double() - counts * a_freq - (counts > 0).double() * a_pres
        ids = torch.tensor(sorted(set(output)))
        got = penalize(logits, ids, ids, counts[ids].float(), presence=a_pres, frequency=a_freq)
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"n": 0}, "n"),
        ({"presence_penalty": float("inf")}, "presence_penalty"),
        ({"top_p": 0.0}, "top_p"),
    ],
)
def test_bad_values_name_their_parameter(kwargs, param):
    with pytest.raises(InvalidSamplingParam) as info:
        SamplingParams(**kwargs)
    assert info.value.param == param and param in str(info.value)


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    path = write_checkpoint(
        ModelConfig.from_hf_dict(KIMI_K3), tmp_path_factory.mktemp("k3") / "m", seed=3, dtype=torch.float32
    )
    return LLM(path, dtype="float32")


def test_penalised_greedy_decoding_equals_a_plain_loop(k3):
    """The engine's penalties use the prompt and every token generated so far: a recomputing loop with
    transformers' repetition processor and the OpenAI presence / frequency formula picks the same tokens."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    prompt = [5, 9, 14, 200, 9]
    params = SamplingParams(
        max_tokens=12,
        temperature=0,
        repetition_penalty=1.8,
        presence_penalty=0.4,
        frequency_penalty=0.3,
        ignore_eos=True,
    )
    got = k3.generate(prompt_token_ids=[prompt], sampling=params)[0].token_ids
    ids, out = list(prompt), []
    with torch.inference_mode():
        for _ in range(12):
            logits = k3.model(torch.tensor([ids]))[0, -1:].float()
            logits = RepetitionPenaltyLogitsProcessor(1.8)(torch.tensor([ids]), logits)[0]
            counts = (
                torch.bincount(torch.tensor(out, dtype=torch.long), minlength=logits.shape[0]).float() if out else 0
            )
            logits = logits - 0.3 * counts - 0.4 * (torch.as_tensor(counts) > 0).float()
            out.append(int(logits.argmax()))
            ids.append(out[-1])
    assert got == out
    plain = k3.generate(
        prompt_token_ids=[prompt], sampling=SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    )[0]
    assert plain.token_ids != got


def test_n_samples_are_the_seeded_single_requests(k3):
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=41, n=3, ignore_eos=True)
    out = k3.generate(prompt_token_ids=[[3, 4, 5]], sampling=params)[0]
    assert len(out.samples) == 3 and out.token_ids == out.samples[0].token_ids
    for i, s in enumerate(out.samples):
        single = SamplingParams(max_tokens=8, temperature=1.0, seed=params.seed_for(i), ignore_eos=True)
        assert s.token_ids == k3.generate(prompt_token_ids=[[3, 4, 5]], sampling=single)[0].token_ids
    assert len({tuple(s.token_ids) for s in out.samples}) > 1
    assert k3.generate(prompt_token_ids=[[3, 4, 5]], sampling=SamplingParams(max_tokens=2))[0].samples == []


def test_penalties_with_speculative_decoding_are_refused(k3):
    spec = LLM(k3.model_dir, dtype="float32", speculative={"method": "ngram", "num_tokens": 2})
    with pytest.raises(ValueError, match="speculative"):
        spec.generate(prompt_token_ids=[[1, 2]], sampling=SamplingParams(repetition_penalty=1.2))
