"""Gaps the mutation audit found in the rollback guard: ``ModelCache.commit`` refuses a step whose KDA
history was not written (an executor that ignored ``keep_states``) also when the history left by an
earlier step or by a slot's previous request is still allocated, and when only the first row is kept."""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.model.rows import row_exact
from nonstop.runtime.executors import ReferenceExecutor
from tests.speculative.helpers import tiny_model


def _prefilled(model, ex, prompt):
    cache = ModelCache(model.cfg, 1, capacity=16)
    b = cache.batch([0], len(prompt))
    ex.forward(torch.tensor([prompt]), cache, b)
    cache.advance(b)
    return cache


def _ignored_keep_states_step(ex, cache, ids):
    """A step an executor ran without keeping states, then committed as a verification step."""
    b = cache.batch([0], len(ids))
    ex.forward(torch.tensor([ids]), cache, b)
    b.keep_states = True
    return b


@pytest.mark.parametrize("keep", [1, 2])
def test_commit_refuses_a_stale_history_of_an_earlier_step(keep):
    model = tiny_model("kimi_k3")
    ex = ReferenceExecutor(model)
    with torch.inference_mode(), row_exact():
        cache = _prefilled(model, ex, [1, 2, 3])
        b = cache.batch([0], 3, keep_states=True)  # a proper verification step, committed
        ex.forward(torch.tensor([[4, 5, 6]]), cache, b)
        cache.commit(b, torch.tensor([2]))
        b = _ignored_keep_states_step(ex, cache, [7, 8, 9])
        with pytest.raises(RuntimeError, match="history"):
            cache.commit(b, torch.tensor([keep]))


def test_commit_refuses_the_history_of_a_slots_previous_request():
    model = tiny_model("kimi_k3")
    ex = ReferenceExecutor(model)
    with torch.inference_mode(), row_exact():
        cache = _prefilled(model, ex, [1, 2, 3])
        b = cache.batch([0], 3, keep_states=True)  # verification step of a request that then fails
        ex.forward(torch.tensor([[4, 5, 6]]), cache, b)
        cache.reset(0)
        b = cache.batch([0], 2)  # the next request's prompt
        ex.forward(torch.tensor([[10, 11]]), cache, b)
        cache.advance(b)
        b = _ignored_keep_states_step(ex, cache, [12, 13, 14])
        with pytest.raises(RuntimeError, match="history"):
            cache.commit(b, torch.tensor([1]))


def test_commit_refuses_a_first_step_without_history():
    model = tiny_model("kimi_k3")
    ex = ReferenceExecutor(model)
    with torch.inference_mode():
        cache = _prefilled(model, ex, [1, 2, 3])
        b = _ignored_keep_states_step(ex, cache, [4, 5, 6])
        with pytest.raises(RuntimeError, match="history"):
            cache.commit(b, torch.tensor([1]))  # all drafts rejected: only row 0 kept
