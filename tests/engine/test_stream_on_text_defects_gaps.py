"""REAL DEFECT: ``LLM.stream(on_text=...)`` does not check ``on_text``. A non-callable one
(``on_text=5``, ``on_text="stdout"``, ``on_text=[print]``) runs the prefill and the first decode step, then
fails deep in ``LLM._run`` with ``'int' object is not callable``, an error naming no argument; on a model
that decodes token ids only it is never called and silently accepted. Every other argument of the public
API is checked up front with a TypeError naming it."""

from __future__ import annotations

import pytest

from nonstop import LLM, SamplingParams

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def k3():
    return LLM("k3-nano", backend="reference", max_batch=1)


@pytest.mark.parametrize("on_text", [5, "stdout", [print]])
def test_a_non_callable_on_text_is_refused_naming_it_before_the_model_runs(k3, on_text, monkeypatch):
    """stream(on_text=<not callable>) must raise a TypeError naming ``on_text`` before any forward runs
    (the forward is made to fail loudly if it is reached)."""

    def no_forward(*args, **kwargs):
        raise AssertionError("the model ran before on_text was checked")

    monkeypatch.setattr(k3.executor, "forward", no_forward)
    with pytest.raises(TypeError, match="on_text"):
        k3.stream("The Python interpreter", SamplingParams(max_tokens=4, temperature=0), on_text=on_text)


def test_a_non_callable_on_text_is_refused_on_an_ids_only_model_too(tmp_path):
    """On a model without text (tokenizer 'ids') on_text is never called, so a non-callable one was
    accepted silently; it must be the same TypeError naming ``on_text``."""
    from tests.engine.tiny_models import synth_checkpoint

    llm = LLM(synth_checkpoint("llama", tmp_path), dtype="float32", backend="reference", tokenizer="ids")
    with pytest.raises(TypeError, match="on_text"):
        llm.stream(None, SamplingParams(max_tokens=2, temperature=0), prompt_ids=[5, 6], on_text=5)
