"""On the bundled k3-nano: greedy outputs with the n-gram and the shipped DSpark drafter equal plain
decoding for many held-out prompts, bit for bit; prompt lookup accepts > 1.5 tokens per step on
repetitive text. The model and its drafter ship in nonstop/assets: a missing one fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from nonstop.engine.sampling import SamplingParams

ASSETS = Path(__file__).resolve().parents[2] / "nonstop" / "assets"


def heldout_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    paragraphs = [p for p in (ASSETS / "heldout_sample.txt").read_text().split("\n") if len(p) > 300]
    prompts = []
    for p in paragraphs:
        ids = tokenizer.encode(p, add_special_tokens=False)
        prompts += [ids[:length], ids[length : 2 * length]]
    return prompts[:n]


@pytest.fixture(scope="module")
def runs():
    from nonstop import LLM

    plain = LLM("k3-nano", max_batch=4, batch_invariant=True)
    prompts = heldout_prompts(plain.tokenizer, 12, 24)
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    return plain, prompts, params, plain.generate(prompt_token_ids=prompts, sampling=params)


@pytest.mark.parametrize("method", ["ngram", "dspark"])
def test_greedy_equals_plain_on_heldout_prompts(runs, method):
    from nonstop import LLM

    plain, prompts, params, want = runs
    spec = LLM("k3-nano", max_batch=4, batch_invariant=False, speculative={"method": method, "num_tokens": 4})
    got = spec.generate(prompt_token_ids=prompts, sampling=params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert sum(o.metrics["accepted_tokens"] for o in got) > 0


def test_ngram_accepts_more_than_1_5_tokens_per_step_on_repetitive_text(runs):
    from nonstop import LLM

    plain, prompts, params, _ = runs
    text = "The following functions are now deprecated in Python 3.4.\n\n" * 3
    spec = LLM("k3-nano", speculative={"method": "ngram", "num_tokens": 4})
    out = spec.generate([text], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))[0]
    assert (
        out.token_ids
        == plain.generate([text], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))[0].token_ids
    )
    assert out.metrics["mean_accepted_length"] > 1.5
