"""``LLM(...)`` construction checks that no other test pins: a bool seed is refused, and the memory preflight
runs by default (and only then)."""

from __future__ import annotations

import pytest

import nonstop.program.preflight as preflight_module
from nonstop import LLM


def test_a_bool_seed_is_refused():
    """``seed=True`` is an int subclass: without the bool check it silently seeds the random weights with 1."""
    with pytest.raises(TypeError, match="seed must be an integer"):
        LLM("k3-nano", backend="reference", seed=True)


def test_the_memory_preflight_refuses_a_model_larger_than_free_memory(monkeypatch):
    """With 1 KiB free, the default preflight refuses k3-nano before allocating it; preflight=False skips it.
    A dropped preflight would load the model and run out of memory later instead of saying why."""
    monkeypatch.setattr(preflight_module, "available_memory", lambda device: 1024)
    with pytest.raises(preflight_module.PreflightError, match="free") as info:
        LLM("k3-nano", backend="reference")
    assert "k3-nano" in str(info.value)
    LLM("k3-nano", backend="reference", preflight=False)


def test_default_sampling_ignores_overrides_given_as_none():
    """``default_sampling(temperature=None)`` keeps the checkpoint's value (k3-nano's generation_config.json:
    temperature 0.7, min_p 0.05, repetition_penalty 1.1); passing the None through would refuse it or clear it."""
    llm = LLM("k3-nano", backend="reference")
    params = llm.default_sampling(temperature=None, top_p=None, max_tokens=5)
    assert params.max_tokens == 5
    assert params.temperature == 0.7
    assert params.min_p == 0.05
    assert params.repetition_penalty == 1.1


def test_speculative_penalty_refusal_names_the_first_penalty_asked():
    """Under speculative decoding a request asking for several penalties is refused with ``param`` naming the
    first in the order repetition, presence, frequency (the server reports that field), and every one listed."""
    from nonstop.engine.sampling import InvalidSamplingParam, SamplingParams

    llm = LLM("k3-nano", backend="reference", speculative={"method": "ngram", "num_tokens": 2})
    params = SamplingParams(max_tokens=2, repetition_penalty=1.2, frequency_penalty=0.5)
    with pytest.raises(InvalidSamplingParam) as info:
        llm.generate(prompt_token_ids=[[1, 2]], sampling=params)
    assert info.value.param == "repetition_penalty"
    assert "repetition_penalty 1.2" in str(info.value) and "frequency_penalty 0.5" in str(info.value)


def test_token_ids_equal_to_the_vocab_size_are_refused():
    """Ids run 0..V-1: a prompt id or stop id of exactly V (k3-nano: 6144) is outside the vocabulary and
    refused with a clear message (an off-by-one would index past the embedding or never stop); V-1 is fine."""
    from nonstop.engine.sampling import SamplingParams

    llm = LLM("k3-nano", backend="reference")
    vocab = llm.cfg.vocab_size
    greedy = SamplingParams(max_tokens=1, temperature=0)
    with pytest.raises(ValueError, match=f"token id {vocab} is outside the vocabulary"):
        llm.generate(prompt_token_ids=[[1, vocab]], sampling=greedy)
    with pytest.raises(ValueError, match=f"stop_token_ids: {vocab} is outside"):
        llm.generate(prompt_token_ids=[[1]], sampling=SamplingParams(max_tokens=1, stop_token_ids=[vocab]))
    out = llm.generate(
        prompt_token_ids=[[vocab - 1]], sampling=SamplingParams(max_tokens=1, stop_token_ids=[vocab - 1])
    )
    assert len(out[0].token_ids) == 1


def test_n_two_gives_two_samples():
    """``SamplingParams(n=2)``: the output holds both completions in ``samples`` (n = 1 is the only case
    without them)."""
    from nonstop.engine.sampling import SamplingParams

    llm = LLM("k3-nano", backend="reference")
    out = llm.generate(prompt_token_ids=[[1, 2]], sampling=SamplingParams(max_tokens=2, n=2, seed=3))
    assert len(out) == 1 and out[0].samples is not None and len(out[0].samples) == 2


def test_n_samples_share_the_prompt_and_use_their_own_seeds():
    """Completion i of an n > 1 request reads the whole prompt and samples with ``seed_for(i)``: each equals a
    single seeded request with that seed (same seed for all would repeat one completion n times)."""
    from nonstop.engine.sampling import SamplingParams

    llm = LLM("k3-nano", backend="reference")
    params = SamplingParams(max_tokens=4, n=3, seed=11, temperature=1.5)
    out = llm.generate(prompt_token_ids=[[5, 6, 7]], sampling=params)[0]
    for i, sample in enumerate(out.samples):
        assert sample.prompt_token_ids == [5, 6, 7]
        alone = SamplingParams(max_tokens=4, seed=params.seed_for(i), temperature=1.5)
        assert sample.token_ids == llm.generate(prompt_token_ids=[[5, 6, 7]], sampling=alone)[0].token_ids
    assert len({tuple(s.token_ids) for s in out.samples}) > 1


def test_stream_takes_exactly_one_of_a_text_prompt_and_prompt_ids():
    """``stream("Hello world", prompt_ids=[5, 6])`` generated from the ids and reported the text as the output's
    prompt, which the tokens never saw (``generate`` refuses the same call). Both, or neither, is now refused;
    either alone streams its own prompt."""
    from nonstop import SamplingParams

    llm = LLM("k3-nano", backend="reference")
    greedy = SamplingParams(max_tokens=2, temperature=0)
    for prompt, ids in (("Hello world", [5, 6]), (None, None)):
        with pytest.raises(ValueError, match="exactly one of prompt or prompt_ids"):
            llm.stream(prompt, greedy, prompt_ids=ids)
    by_text = llm.stream("Hello world", greedy)
    assert by_text.prompt == "Hello world"
    assert by_text.prompt_token_ids == llm.tokenizer.encode("Hello world")
    assert llm.stream(None, greedy, prompt_ids=[5, 6]).prompt_token_ids == [5, 6]


def test_the_memory_refusal_names_the_python_option_as_well_as_the_flag(monkeypatch):
    """From Python the refusal said only "pass --no-preflight", the command line's flag; it now also names
    ``preflight=False``."""
    monkeypatch.setattr(preflight_module, "available_memory", lambda device: 1024)
    with pytest.raises(preflight_module.PreflightError, match=r"--no-preflight.*preflight=False"):
        LLM("k3-nano", backend="reference")
