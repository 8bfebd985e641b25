"""Black-box consistency of what ``LLM.generate`` returns (gaps a probe of the public API found untested):
each output's fields agree with each other and with its own SamplingParams from a per-prompt list, and the
log-probabilities reported for generated tokens are the ones the model gives the same tokens when they are
fed back as a prompt (``prompt_logprobs``: another code path), as the README documents (the model's own
log-probabilities, before penalties, temperature and filters).

Expected values come from the tokenizer itself (encode / decode), from the SamplingParams given, from hand
arithmetic, or from the engine's prompt-scoring path - never from the field under test."""

from __future__ import annotations

import pytest

from nonstop import LLM, SamplingParams

pytestmark = pytest.mark.timeout(180)

PROMPTS = ["The interpreter", "A list is", "import os"]


@pytest.fixture(scope="module")
def k3():
    return LLM("k3-nano", backend="reference", max_batch=2)


def test_output_fields_agree_with_each_other_and_with_each_prompts_sampling(k3):
    """Catches a per-prompt SamplingParams list applied to the wrong prompts, metrics that miscount the
    tokens, a finish_reason ``length`` that does not mean ``len(token_ids) == max_tokens``, logprobs rows
    that miss the chosen token or hold more than k + 1 entries, and text that is not the decode of the ids.
    Three prompts, three different max_tokens (4, 7, 11), with max_batch 2 so that one waits."""
    sps = [
        SamplingParams(temperature=0, max_tokens=4, logprobs=0),
        SamplingParams(temperature=0.9, max_tokens=7, seed=3, logprobs=3, top_k=40),
        SamplingParams(temperature=0.7, max_tokens=11, seed=5, logprobs=1, min_p=0.05, repetition_penalty=1.1),
    ]
    outs = k3.generate(PROMPTS, sps)
    assert len(outs) == 3
    for prompt, sp, out in zip(PROMPTS, sps, outs):
        assert out.prompt == prompt
        assert out.prompt_token_ids == k3.tokenizer.encode(prompt)
        assert out.metrics["prompt_tokens"] == len(out.prompt_token_ids)
        assert out.metrics["generated_tokens"] == len(out.token_ids)
        assert 1 <= len(out.token_ids) <= sp.max_tokens
        assert (out.finish_reason == "length") == (len(out.token_ids) == sp.max_tokens)
        assert out.finish_reason in ("length", "stop")
        assert len(out.logprobs) == len(out.token_ids)
        for token, row in zip(out.token_ids, out.logprobs):
            assert token in row
            assert len(row) in (max(sp.logprobs, 1), sp.logprobs + 1)  # top k, plus the chosen one if not in it
            assert all(v <= 0.0 for v in row.values())
        assert out.text == k3.tokenizer.decode(out.token_ids)
        assert out.error is None and out.samples == []
    # k3-nano does not end these prompts early (hand-checked once: no EOS within 11 tokens); so each output
    # is exactly as long as its own max_tokens, which pins which SamplingParams went to which prompt
    assert [len(o.token_ids) for o in outs] == [4, 7, 11]


@pytest.mark.parametrize("speculative", [None, {"method": "ngram", "num_tokens": 4, "ngram_min": 1}])
def test_logprobs_of_generated_tokens_are_their_prompt_logprobs_when_fed_back(speculative):
    """Catches logprobs taken after temperature, penalties or filters (the README promises the model's own
    log-probabilities), on the plain and the speculative path: a sampled continuation (temperature 0.6,
    repetition penalty 1.5, top_k 30) is fed back as a prompt with prompt_logprobs=0, and the log-probability
    each generated token gets there (one forward over the whole sequence) must be the one reported while
    generating, to float32 rounding."""
    llm = LLM("k3-nano", backend="reference", max_batch=2, speculative=speculative)
    penalty = {} if speculative else {"repetition_penalty": 1.5}
    sp = SamplingParams(temperature=0.6, top_k=30, max_tokens=10, seed=11, logprobs=0, **penalty)
    out = llm.generate([PROMPTS[0]], sp)[0]
    full = out.prompt_token_ids + out.token_ids
    scored = llm.generate(
        prompt_token_ids=[full], sampling=SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    )[0]
    start = len(out.prompt_token_ids)
    assert len(scored.prompt_logprobs) == len(full)
    for i, token in enumerate(out.token_ids):
        want = scored.prompt_logprobs[start + i][token]
        assert out.logprobs[i][token] == pytest.approx(want, abs=2e-4), i
