"""Gaps a mutation audit of ``runtime/superop.py`` found: ``sample_tokens`` (n decode steps sampled on the
device) must advance the cache by n and leave it as n reference steps would. The tiny llama's greedy
continuation repeats the last prompt token whatever its cache holds, so the token comparisons of the device
decode tests pass even when the cache is never advanced; this test checks the cache itself."""

from __future__ import annotations

import copy

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.runtime.device_sampling import SampleRow
from nonstop.runtime.superop import SuperOpExecutor
from tests.runtime.helpers import skip_unless_kernels, tiny_model


@pytest.fixture(scope="module")
def llama():
    return skip_unless_kernels(tiny_model("llama"))


def test_greedy_sample_tokens_advances_the_cache_as_reference_steps_do(llama):
    """Slots 2 and 0 with 5 and 2 tokens cached, 3 greedy device steps: the tokens are the reference's argmax
    step by step, each slot's length grows by 3 and its K/V rows hold what the reference wrote."""
    cache = ModelCache(llama.cfg, 3, capacity=8, page_size=4)
    for slot, prompt in ((2, [5, 6, 7, 8, 9]), (0, [11, 12])):
        batch = cache.batch([slot], len(prompt))
        llama(torch.tensor([prompt]), cache, batch)
        cache.advance(batch)
    ref = copy.deepcopy(cache)
    ex = SuperOpExecutor(llama, graphs=False)
    ids = torch.tensor([[40], [41]])
    got = ex.sample_tokens(ids, cache, [2, 0], 3, [SampleRow(), SampleRow()])
    want, step_ids = [], ids
    for _ in range(3):
        batch = ref.batch([2, 0], 1)
        logits = llama(step_ids, ref, batch, last_only=True)
        ref.advance(batch)
        step_ids = logits.argmax(-1, keepdim=True)
        want.append(step_ids)
    assert got.tolist() == torch.cat(want, 1).tolist()
    assert cache.lengths.tolist() == [5, 0, 8] == ref.lengths.tolist()
    batch = cache.batch([2, 0], 1)
    for mine, theirs in zip(cache.layers, ref.layers):
        for name in mine.tensors:
            a, b = mine.read(batch, name), theirs.read(batch, name)
            for row, n in enumerate((8, 5)):  # each row's own tokens (later positions hold stale rows)
                torch.testing.assert_close(a[row, :n], b[row, :n], rtol=1e-4, atol=1e-5)
    assert ex.stats["device_sampled_steps"] == 3
