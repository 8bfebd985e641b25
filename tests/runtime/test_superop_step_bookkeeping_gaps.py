"""Gaps a mutation audit of ``runtime/superop.py``'s host side found: the eager launch count stops once two
counts agree (counting wraps every operator in a dispatch mode: a slower step), and a one-token decode step
through the program gives the reference's logits for rows of different lengths in slots out of order."""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.runtime.superop import SuperOpExecutor
from tests.runtime.helpers import tiny_model


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def test_the_launch_count_stops_once_two_counts_agree(llama):
    """Eager steps of one shape are counted until two counts agree, then run uncounted: a step counted
    forever pays the counter's per-operator overhead on every decode step."""
    ex = SuperOpExecutor(llama, use_kernels=False, graphs=False)
    counted = []
    original = ex._launch_counted
    ex._launch_counted = lambda env, step: counted.append(step.name) or original(env, step)
    cache = ModelCache(llama.cfg, 2, capacity=16)
    for i in range(6):
        batch = cache.batch([1, 0], 1)
        ex.forward(torch.tensor([[3 + i], [9 + i]]), cache, batch)
        cache.advance(batch)
    assert counted == ["2x1", "2x1"]
    assert ex.stats["eager_steps"] == 6 and ex.stats["launches_per_step"] > 0


def test_a_decode_step_of_rows_of_different_lengths_is_the_references(llama):
    """Slots 2 and 0 with 5 and 2 tokens cached: the program's step (twins) gives the reference's logits
    and cache, step after step (the slots / starts of each step, not a stale shape's)."""
    ex = SuperOpExecutor(llama, use_kernels=False, graphs="emulate")
    caches = [ModelCache(llama.cfg, 3, capacity=8, page_size=4) for _ in range(2)]
    for cache in caches:
        for slot, prompt in ((2, [5, 6, 7, 8, 9]), (0, [11, 12])):
            batch = cache.batch([slot], len(prompt))
            llama(torch.tensor([prompt]), cache, batch)
            cache.advance(batch)
    for step in range(4):
        ids = torch.tensor([[20 + step], [30 + step]])
        outs = []
        for cache, fn in ((caches[0], ex.forward), (caches[1], llama.forward)):
            batch = cache.batch([2, 0], 1)
            outs.append(fn(ids, cache, batch, last_only=True))
            cache.advance(batch)
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    assert ex.stats["program_steps"] == 4


def test_hidden_states_of_a_verification_step_come_from_that_step(llama):
    """``forward_hidden`` on a speculative verification step (``keep_states``) reads the taps of that step's
    own buffers; read from the plain step's buffers of the same shape it returns another step's (or unset)
    residual stream."""
    ex = SuperOpExecutor(llama, use_kernels=False, graphs=False)
    caches = [ModelCache(llama.cfg, 1, capacity=16, page_size=4) for _ in range(2)]
    L = llama.cfg.num_hidden_layers
    for cache in caches:
        batch = cache.batch([0], 4)
        llama(torch.tensor([[3, 4, 5, 6]]), cache, batch)
        cache.advance(batch)
    plain = caches[0].batch([0], 2)
    ex.forward_hidden(torch.tensor([[40, 41]]), caches[0], plain, (L,))  # the plain 1x2 step: other values
    ids = torch.tensor([[7, 8]])
    got_logits, got = ex.forward_hidden(ids, caches[0], caches[0].batch([0], 2, keep_states=True), (L,))
    want_logits, want = llama.forward_hidden(ids, caches[1], caches[1].batch([0], 2, keep_states=True), (L,))
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[L], want[L], rtol=1e-5, atol=1e-5)
