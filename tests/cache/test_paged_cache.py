"""Paged attention caches: the page table's bookkeeping, and paged == contiguous model outputs."""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.pages import PageTable
from nonstop.cache.state import ModelCache
from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from tests.engine.tiny_models import TINY_MODELS


def test_page_table_reserves_releases_and_reuses_pages():
    pages = PageTable(num_slots=3, page_size=4, num_pages=2)
    pages.reserve(0, 5)  # 2 pages
    assert pages.slot_pages[0] == [0, 1] and pages.used_pages == 2
    pages.reserve(1, 1)  # pool grows
    assert pages.num_pages >= 3 and pages.slot_pages[1] == [2]
    rows = pages.rows(torch.tensor([0, 1]), torch.tensor([[0, 4], [3, 0]]))
    assert rows.tolist() == [[0, 4], [11, 8]]
    pages.release(0)
    assert pages.slot_pages[0] == [] and pages.used_pages == 1
    pages.reserve(2, 8)  # reuses the freed pages
    assert sorted(pages.slot_pages[2]) == [0, 1]
    pages.reserve(2, 8)  # idempotent
    assert len(pages.slot_pages[2]) == 2


def _run_schedule(model, cfg, page_size: int) -> list[torch.Tensor]:
    """Prefill three slots with different lengths, decode them together, free one, reuse its slot."""
    gen = torch.Generator().manual_seed(0)
    cache = ModelCache(cfg, num_slots=3, capacity=4, page_size=page_size)
    outs = []

    def step(slots, T):
        ids = torch.randint(0, cfg.vocab_size, (len(slots), T), generator=gen)
        batch = cache.batch(slots, T)
        outs.append(model(ids, cache, batch))
        cache.advance(batch)

    with torch.inference_mode():
        step([0], 7)
        step([1], 2)
        step([2], 11)
        for _ in range(3):
            step([0, 1, 2], 1)
        step([1, 2], 3)  # a chunk appended at different starts
        cache.reset(0)
        step([0], 5)  # the slot's old pages hold stale data
        for _ in range(2):
            step([2, 0, 1], 1)
    return outs


@pytest.mark.parametrize("name", ["k3", "llama"])
def test_paged_cache_equals_contiguous(name):
    cfg = ModelConfig.from_file(TINY_MODELS[name])
    model = random_model(cfg, torch.float32, "cpu", seed=0)
    contiguous = _run_schedule(model, cfg, page_size=64)  # one page per slot: contiguous storage
    for page_size in (1, 3):
        paged = _run_schedule(model, cfg, page_size=page_size)
        for a, b in zip(contiguous, paged):
            assert torch.equal(a, b)


def test_reset_returns_pages_to_the_pool():
    cfg = ModelConfig.from_file(TINY_MODELS["llama"])
    cache = ModelCache(cfg, num_slots=2, capacity=4, page_size=2)
    cache.batch([0, 1], 9)
    assert cache.pages.used_pages == 10
    cache.reset(0)
    cache.reset(1)
    assert cache.pages.used_pages == 0
