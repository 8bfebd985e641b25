"""Speculative decoding through the public ``LLM`` API on a tiny synthesized checkpoint, against plain
decoding of the same checkpoint: a degenerate sampling distribution (top_k 1) must give plain greedy's
tokens through rejection sampling, the draft length is cut by max_tokens, and the acceptance metrics add up."""

from __future__ import annotations

import pytest

from nonstop import LLM, SamplingParams
from tests.engine.tiny_models import synth_checkpoint

# the tiny random model repeats "a" after "aaaaaaaa" (so n-gram drafts are accepted); the others draft little
PROMPTS = ["aaaaaaaa", "abab", "hello hello hello hel"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return synth_checkpoint("k3", tmp_path_factory.mktemp("tiny-k3"))


@pytest.fixture(scope="module")
def greedy(model_dir):
    """Plain greedy decoding (no speculation), one request per forward."""
    llm = LLM(model_dir, backend="reference", batch_invariant=True)
    return llm.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))


# the tiny random llama falls into two-token cycles after these prompts: whole blocks accepted, bonus tokens
# that differ from the block's first draft
LLAMA_PROMPTS = ["xyxyxyxyx", "the cat the cat the"]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return synth_checkpoint("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.mark.parametrize("k", [1, 4, 15])
def test_top_k_one_sampling_under_speculation_is_plain_greedy_llama(llama_dir, k):
    """As below, on prompts whose drafts are accepted whole, so every block ends with a bonus token: catches
    a bonus token drawn from the wrong row of the target's distributions."""
    plain = LLM(llama_dir, backend="reference", batch_invariant=True)
    want = plain.generate(LLAMA_PROMPTS, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    llm = LLM(llama_dir, backend="reference", speculative={"method": "ngram", "num_tokens": k})
    sampled = SamplingParams(max_tokens=16, temperature=1.0, top_k=1, seed=11, ignore_eos=True)
    got = llm.generate(LLAMA_PROMPTS, sampled)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert all(o.metrics["accepted_tokens"] > 0 for o in got)


@pytest.mark.parametrize("k", [1, 4, 15])
def test_top_k_one_sampling_under_speculation_is_plain_greedy(model_dir, greedy, k):
    """With top_k=1 the target distribution is one-hot on the argmax, so rejection sampling must accept a
    draft exactly when it is the argmax and draw the argmax otherwise (and as the bonus token). Catches a
    verifier that tests drafts against the unfiltered softmax, draws the correction or the bonus from the
    wrong row, or ignores the request's filters."""
    llm = LLM(model_dir, backend="reference", speculative={"method": "ngram", "num_tokens": k})
    sampled = SamplingParams(max_tokens=16, temperature=1.0, top_k=1, seed=11, ignore_eos=True)
    got = llm.generate(PROMPTS, sampled)
    assert [o.token_ids for o in got] == [o.token_ids for o in greedy]
    assert sum(o.metrics["accepted_tokens"] for o in got) > 0  # drafts were verified, not only skipped


@pytest.mark.parametrize("k", [1, 3, 7, 15])
def test_acceptance_metrics_add_up_when_requests_end_by_length(model_dir, greedy, k):
    """Each verification step emits its accepted drafts plus one token; the first token comes from the
    prompt. So for a request ending by length: accepted + verify_steps = generated - 1, accepted <= drafted,
    and mean_accepted_length = (generated - 1) / verify_steps. Rows share one padded forward here
    (batch_invariant=False). Catches miscounted drafts, accepted tokens or steps, and greedy outputs that
    differ from plain decoding."""
    llm = LLM(model_dir, backend="reference", speculative={"method": "ngram", "num_tokens": k})
    got = llm.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    assert [o.token_ids for o in got] == [o.token_ids for o in greedy]
    for o in got:
        m, n = o.metrics, len(o.token_ids)
        assert o.finish_reason == "length" and n == 16
        assert 0 <= m["accepted_tokens"] <= m["drafted_tokens"] <= k * m["verify_steps"]
        assert m["accepted_tokens"] + m["verify_steps"] == n - 1
        assert m["mean_accepted_length"] == pytest.approx((n - 1) / m["verify_steps"])
        assert 1 <= m["mean_accepted_length"] <= k + 1


@pytest.mark.parametrize("max_tokens", [1, 2, 3])
def test_draft_length_is_cut_by_max_tokens(model_dir, greedy, max_tokens):
    """A draft block may not run past max_tokens: with 15 drafts allowed, max_tokens 1 leaves no decode
    step (the token comes from the prompt), max_tokens 2 one step with no draft, max_tokens 3 at most one
    draft (one step if it is accepted, as for "aaaaaaaa", else two). The tokens are plain greedy's prefix.
    Catches a draft length that ignores max_tokens (extra tokens or a wasted step)."""
    llm = LLM(model_dir, backend="reference", speculative={"method": "ngram", "num_tokens": 15})
    got = llm.generate(PROMPTS, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    for o, want in zip(got, greedy):
        assert o.token_ids == want.token_ids[:max_tokens] and o.finish_reason == "length"
        m = o.metrics
        assert m["drafted_tokens"] <= max(0, max_tokens - 2)
        assert m["verify_steps"] == max_tokens - 1 - m["accepted_tokens"]
        if max_tokens == 1:
            assert m["mean_accepted_length"] is None
        else:
            assert m["mean_accepted_length"] == pytest.approx((max_tokens - 1) / m["verify_steps"])
    if max_tokens == 3:
        assert got[0].metrics["accepted_tokens"] == 1 and got[0].metrics["verify_steps"] == 1
