"""Slot lengths after ``advance`` and page ownership under random reserve / release: checks a mutation
audit of ``nonstop/cache`` found missing.

Expected values come from the contracts in the docstrings (lengths become start + T; every page id is
owned by at most one slot or the free list) and a plain-Python model of the bookkeeping in the test.
"""

from __future__ import annotations

import random

import pytest
import torch

from nonstop.cache.pages import PageTable
from nonstop.cache.state import ModelCache
from nonstop.config import ModelConfig
from tests.engine.tiny_models import TINY_MODELS


def _llama_cache(num_slots: int = 2) -> ModelCache:
    return ModelCache(
        ModelConfig.from_file(TINY_MODELS["llama"]),
        num_slots=num_slots,
        capacity=4,
        page_size=2,
    )


def test_advancing_the_same_batch_twice_sets_the_length_once():
    """Catches ``advance`` adding T to the slot's current length instead of to the batch's start: a
    repeated advance (or a commit after an advance) would then push the sequence past its real tokens."""
    cache = _llama_cache()
    batch = cache.batch([1, 0], 3)  # both slots empty: start 0, end 3
    cache.advance(batch)
    cache.advance(batch)
    assert cache.lengths.tolist() == [3, 3]
    cache.advance(batch, [1, 2])  # fewer tokens kept: start + counts, not length + counts
    assert cache.lengths.tolist() == [2, 1]


def test_random_reserve_and_release_never_share_a_page():
    """Catches page bookkeeping that hands one page to two owners (a slot twice, two slots, or a slot and
    the free list), loses a freed page, or lets the table disagree with the slot's page list."""
    rng = random.Random(0)
    page_size, num_slots = 3, 4
    table = PageTable(num_slots, page_size, num_pages=2)
    lengths = [0] * num_slots  # the test's own model: tokens each slot must hold
    for _ in range(200):
        slot = rng.randrange(num_slots)
        if rng.random() < 0.25:
            table.release(slot)
            lengths[slot] = 0
        else:
            lengths[slot] += rng.randrange(0, 8)
            table.reserve(slot, lengths[slot])
        owned = [p for pages in table.slot_pages for p in pages]
        assert sorted(owned + table.free_pages) == list(range(table.num_pages))  # each page exactly once
        for s in range(num_slots):
            assert len(table.slot_pages[s]) == -(-lengths[s] // page_size)
            n = len(table.slot_pages[s])
            assert table.table[s, :n].tolist() == table.slot_pages[s]
            if n:  # every token of the slot has its own pool row, inside the pool
                rows = table.rows(torch.tensor([s]), torch.arange(lengths[s])[None, :])[0].tolist()
                assert rows == [
                    table.slot_pages[s][p // page_size] * page_size + p % page_size for p in range(lengths[s])
                ]
        assert table.used_pages == len(owned)


@pytest.mark.parametrize("slots", [[-1], [2], [0, 0], [1, 0, 1]])
def test_a_negative_out_of_range_or_repeated_slot_is_refused_and_changes_nothing(slots):
    """A slot of -1 indexed the last sequence's length and pages (it reserved slot 1's pages and advanced its
    length), 2 on a 2-slot cache was a bare IndexError, and a slot twice in one step let two rows write the same
    positions of one sequence. Each is a ValueError naming the slots, and no page or length moves."""
    cache = _llama_cache()
    with pytest.raises(ValueError, match=r"distinct cache slots in 0\.\.1"):
        cache.batch(slots, 3)
    assert cache.lengths.tolist() == [0, 0]
    assert cache.pages.slot_pages == [[], []]
    batch = cache.batch([1, 0], 1)  # distinct in-range slots in any order still work
    cache.advance(batch)
    assert cache.lengths.tolist() == [1, 1]
