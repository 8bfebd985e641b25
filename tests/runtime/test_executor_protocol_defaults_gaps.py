"""The defaults ``runtime/interface.Executor`` gives a backend that declares ``class X(Executor)`` and
implements only what it must: not batch invariant, no row limit, no device sampling (``sample_tokens``
refuses, naming the backend), and ``new_cache`` a ``ModelCache`` of the asked slots, dtype and page size with
``INITIAL_SLOT_TOKENS`` (64) tokens a slot reserved up front."""

from __future__ import annotations

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.runtime.interface import Executor
from tests.tiny_configs import TINY_CONFIGS


class Minimal(Executor):
    name = "minimal"

    def __init__(self):
        self.stats = {}

    def forward(self, input_ids, cache, batch, last_only=False):
        raise AssertionError("not called")

    def forward_hidden(self, input_ids, cache, batch, taps):
        raise AssertionError("not called")


def test_a_minimal_backend_gets_the_documented_defaults():
    """A default of True for batch_invariant would let the engine batch rows whose logits depend on each
    other; a row limit or device sampling by default would misroute every new backend's steps."""
    ex = Minimal()
    assert ex.batch_invariant is False and ex.max_rows is None and ex.samples_on_device is False
    with pytest.raises(NotImplementedError, match="the minimal executor does not sample on the device"):
        ex.sample_tokens(torch.zeros(1, 1, dtype=torch.long), None, [0], 2, [])


@pytest.mark.parametrize("dtype,page_size", [(torch.bfloat16, 4), (torch.float16, 16)])
def test_the_default_cache_has_the_asked_slots_dtype_pages_and_initial_tokens(dtype, page_size):
    """3 slots x 64 tokens up front = 3 x ceil(64 / page_size) pages of page_size rows in every pool, stored in
    ``dtype`` (an fp32 default would double the cache's memory)."""
    cfg = ModelConfig.from_hf_dict(TINY_CONFIGS["llama"])
    cache = Minimal().new_cache(cfg, 3, dtype, torch.device("cpu"), page_size)
    assert cache.num_slots == 3 and cache.pages.page_size == page_size
    assert cache.pages.num_pages == 3 * -(-64 // page_size)
    for layer in cache.layers:
        assert layer.capacity == 3 * -(-64 // page_size) * page_size
        assert all(t.dtype == dtype for t in layer.tensors.values())
