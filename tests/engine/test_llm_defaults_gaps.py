"""``LLM`` checkpoint defaults and ``generate`` input checks no other test pins: ``generation_config=False``
ignores generation_config.json, speculative decoding drops the checkpoint's repetition penalty (noted once),
and ``generate`` given both text prompts and token ids refuses them."""

from __future__ import annotations

import pytest

from nonstop import LLM, SamplingParams

# nonstop/assets/k3-nano/generation_config.json: temperature 0.7, min_p 0.05, repetition_penalty 1.1,
# max_new_tokens 64; config.json: eos_token_id 1 (the same id as the generation config's)


def test_generation_config_false_ignores_the_checkpoint_defaults():
    """``generation_config=False`` must give the library's own defaults (SamplingParams()), not k3-nano's
    temperature 0.7 / min_p 0.05 / repetition_penalty 1.1 / max_tokens 64; the default (True) gives those."""
    off = LLM("k3-nano", backend="reference", generation_config=False, preflight=False)
    assert off.sampling_defaults() == {}
    assert off.default_sampling() == SamplingParams()
    on = LLM("k3-nano", backend="reference", preflight=False)
    got = on.default_sampling()
    assert (got.temperature, got.min_p, got.repetition_penalty, got.max_tokens) == (0.7, 0.05, 1.1, 64)


def test_speculative_decoding_drops_the_checkpoint_penalty_once(capsys):
    """Under speculative decoding k3-nano's repetition_penalty 1.1 is dropped from the defaults (else every
    default request would be refused for asking a penalty), said once on stderr however often the defaults
    are read; the other defaults stay."""
    llm = LLM("k3-nano", backend="reference", preflight=False, speculative={"method": "ngram", "num_tokens": 2})
    capsys.readouterr()
    first = llm.sampling_defaults()
    second = llm.default_sampling()
    err = capsys.readouterr().err
    assert "repetition_penalty" not in first
    assert first == {"temperature": 0.7, "min_p": 0.05, "max_tokens": 64}
    assert second.repetition_penalty == 1.0 and second.temperature == 0.7
    assert err.count("not applying the checkpoint's repetition_penalty 1.1") == 1
    greedy = llm.default_sampling(max_tokens=2, temperature=0, ignore_eos=True)
    out = llm.generate(prompt_token_ids=[[5, 6]], sampling=greedy)
    assert len(out[0].token_ids) == 2


def test_without_speculative_decoding_the_penalty_is_kept_and_nothing_is_said(capsys):
    """Plain decoding applies the checkpoint's repetition_penalty 1.1 and prints no note about dropping it."""
    llm = LLM("k3-nano", backend="reference", preflight=False)
    capsys.readouterr()
    assert llm.sampling_defaults()["repetition_penalty"] == 1.1
    assert "not applying" not in capsys.readouterr().err


def test_generate_refuses_both_prompts_and_prompt_token_ids():
    """``generate(["Hi"], prompt_token_ids=[[5, 6]])`` is ambiguous (which prompt?): refused, as is neither."""
    llm = LLM("k3-nano", backend="reference", preflight=False)
    greedy = SamplingParams(max_tokens=1, temperature=0)
    with pytest.raises(ValueError, match="exactly one of prompts or prompt_token_ids"):
        llm.generate(["Hi"], greedy, prompt_token_ids=[[5, 6]])
    with pytest.raises(ValueError, match="exactly one of prompts or prompt_token_ids"):
        llm.generate(None, greedy)


def test_a_tuple_of_sampling_params_is_one_per_prompt():
    """``sampling`` may be a tuple (one SamplingParams per prompt), as the docstring says, not only a list."""
    llm = LLM("k3-nano", backend="reference", preflight=False)
    greedy = {"temperature": 0, "ignore_eos": True}
    params = (SamplingParams(max_tokens=1, **greedy), SamplingParams(max_tokens=3, **greedy))
    out = llm.generate(prompt_token_ids=[[5, 6], [7]], sampling=params)
    assert [len(o.token_ids) for o in out] == [1, 3]


def _decode_rows(llm: LLM, prompts: list[list[int]]) -> list[int]:
    """Rows of every one-token (decode) forward while ``llm`` generates 3 greedy tokens for each prompt."""
    shapes = []
    forward = llm.executor.forward

    def recording(input_ids, *args, **kwargs):
        shapes.append(tuple(input_ids.shape))
        return forward(input_ids, *args, **kwargs)

    llm.executor.forward = recording
    greedy = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    out = llm.generate(prompt_token_ids=prompts, sampling=greedy)
    assert [len(o.token_ids) for o in out] == [3] * len(prompts)
    return [rows for rows, tokens in shapes if tokens == 1]


PROMPTS = [[5, 6], [7, 8, 9], [10]]


def test_batch_invariant_runs_each_sequence_in_a_forward_of_its_own():
    """``batch_invariant=True`` must reach the engine: every decode forward holds one row (dropping it batches
    the three prompts together); the default batches them."""
    split = LLM("k3-nano", backend="reference", preflight=False, batch_invariant=True)
    assert set(_decode_rows(split, PROMPTS)) == {1}
    whole = LLM("k3-nano", backend="reference", preflight=False)
    assert max(_decode_rows(whole, PROMPTS)) == 3


def test_max_batch_bounds_the_sequences_decoded_together():
    """``max_batch=2`` with three prompts: at most two rows per decode forward (the engine gets
    min(max_batch, requests) slots), and two at some point (not one)."""
    llm = LLM("k3-nano", backend="reference", preflight=False, max_batch=2)
    assert max(_decode_rows(llm, PROMPTS)) == 2


@pytest.mark.parametrize("fields", [{"temperature": 0.5}, {"temperature": 0.5, "repetition_penalty": 1.0}])
def test_a_neutral_or_absent_checkpoint_penalty_is_left_alone_under_speculative_decoding(tmp_path, capsys, fields):
    """Only a penalty other than 1.0 is dropped: a checkpoint without one, or with the neutral 1.0, keeps its
    defaults as they are and says nothing (a wrong threshold pops a missing key, a KeyError, or notes a
    penalty that was never applied)."""
    import json

    from tests.engine.tiny_models import synth_checkpoint

    model = synth_checkpoint("llama", tmp_path / "m")
    (model / "generation_config.json").write_text(json.dumps(fields))
    llm = LLM(model, backend="reference", preflight=False, speculative={"method": "ngram", "num_tokens": 2})
    capsys.readouterr()
    assert llm.sampling_defaults() == fields
    assert "not applying" not in capsys.readouterr().err


def test_stream_calls_on_text_only_with_text():
    """A model decoding token ids only (``tokenizer="ids"``) has no text to show: ``on_text`` is never called
    (not once per token with ""); with text, each call carries a non-empty piece and together they are the text."""
    greedy = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    pieces = []
    ids_only = LLM("k3-nano", backend="reference", preflight=False, tokenizer="ids")
    out = ids_only.stream(None, greedy, prompt_ids=[5, 6], on_text=pieces.append)
    assert len(out.token_ids) == 3 and pieces == []
    text = LLM("k3-nano", backend="reference", preflight=False)
    out = text.stream(None, greedy, prompt_ids=[5, 6], on_text=pieces.append)
    assert pieces and all(pieces) and "".join(pieces) == out.text


def test_generation_config_eos_ids_end_generation(tmp_path):
    """An eos id listed only in generation_config.json (as Llama 3 instruct lists its end-of-turn ids there)
    ends a request as config.json's does: greedy generation stops at it with finish_reason "stop"; with
    ``generation_config=False`` it is an ordinary token."""
    import json

    from tests.engine.tiny_models import synth_checkpoint

    model = synth_checkpoint("llama", tmp_path / "m")
    greedy = SamplingParams(max_tokens=4, temperature=0)
    plain = LLM(model, backend="reference", preflight=False)
    free = plain.generate(prompt_token_ids=[[5, 6]], sampling=greedy)[0]
    first = free.token_ids[0]
    assert first not in plain.eos_ids and free.finish_reason == "length"  # the synthetic model runs to the end
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [first]}))
    llm = LLM(model, backend="reference", preflight=False)
    assert llm.eos_ids == plain.eos_ids | {first}
    out = llm.generate(prompt_token_ids=[[5, 6]], sampling=greedy)[0]
    assert out.finish_reason == "stop" and out.token_ids[-1:] == [first] and len(out.token_ids) == 1
    off = LLM(model, backend="reference", preflight=False, generation_config=False)
    assert off.generate(prompt_token_ids=[[5, 6]], sampling=greedy)[0].token_ids == free.token_ids


@pytest.mark.parametrize("prompt", [123, b"Hi", ["Hi"]])
def test_stream_refuses_a_prompt_that_is_not_a_string(prompt):
    """``stream(123)`` / ``stream(b"Hi")`` / ``stream(["Hi"])``: a TypeError naming the type, not whatever the
    tokenizer does with it (generate's prompt_list checks its prompts itself; stream relies on make_request)."""
    llm = LLM("k3-nano", backend="reference", preflight=False)
    with pytest.raises(TypeError, match="prompts must be strings, got"):
        llm.stream(prompt, SamplingParams(max_tokens=1))


def test_the_n_samples_of_a_prompt_have_their_own_request_ids():
    """Completion i of an n > 1 prompt is request "<id>-i": distinct ids (one id for all would make the samples
    indistinguishable in anything keyed by request id)."""
    llm = LLM("k3-nano", backend="reference", preflight=False)
    out = llm.generate(prompt_token_ids=[[5, 6]], sampling=SamplingParams(max_tokens=1, n=3, seed=1))[0]
    ids = [s.request_id for s in out.samples]
    assert len(set(ids)) == 3 and [i.rsplit("-", 1)[1] for i in ids] == ["0", "1", "2"]


def test_stream_refuses_n_two():
    """``stream`` gives one completion: n = 2 is refused (not silently streamed as one), n = 1 works."""
    llm = LLM("k3-nano", backend="reference", preflight=False)
    with pytest.raises(ValueError, match="n must be 1, got 2"):
        llm.stream(None, SamplingParams(max_tokens=1, n=2), prompt_ids=[5, 6])
    assert len(llm.stream(None, SamplingParams(max_tokens=1), prompt_ids=[5, 6]).token_ids) == 1


def test_generate_without_sampling_uses_the_checkpoint_defaults(tmp_path):
    """``generate(..., sampling=None)`` takes generation_config.json's defaults: max_new_tokens 3 with do_sample
    false gives 3 greedy tokens (the library default would give 16 sampled ones)."""
    import json

    from tests.engine.tiny_models import synth_checkpoint

    model = synth_checkpoint("llama", tmp_path / "m")
    (model / "generation_config.json").write_text(json.dumps({"max_new_tokens": 3, "do_sample": False}))
    llm = LLM(model, backend="reference", preflight=False)
    out = llm.generate(prompt_token_ids=[[5, 6]])[0]
    greedy = llm.generate(prompt_token_ids=[[5, 6]], sampling=SamplingParams(max_tokens=3, temperature=0))[0]
    assert out.token_ids == greedy.token_ids and len(out.token_ids) == 3
