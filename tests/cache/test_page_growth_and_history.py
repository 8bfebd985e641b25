"""Page-table growth and KDA history commits: checks a mutation audit found missing.

Expected values come from the definitions (page arithmetic, the commit contract), not from the code.
"""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.pages import PageTable
from nonstop.cache.state import KDAState


def _rows(table: PageTable, slot: int, length: int) -> list[int]:
    return table.rows(torch.tensor([slot]), torch.arange(length)[None, :])[0].tolist()


def test_reserve_grows_the_pool_past_twice_when_one_slot_needs_more():
    # 2 slots, 16-token pages, 8 pages: slot 0 takes 1, leaving 7; slot 1 then needs 272 / 16 = 17 pages,
    # so the pool needs at least 1 + 17 = 18 pages, more than the doubling to 16 gives
    table = PageTable(2, 16, 8)
    table.reserve(0, 16)
    table.reserve(1, 272)
    assert table.num_pages >= 18
    assert len(table.slot_pages[1]) == 17
    a, b = _rows(table, 0, 16), _rows(table, 1, 272)
    assert len(set(a + b)) == 16 + 272  # no row shared, within a slot or between them
    assert all(0 <= r < table.num_pages * 16 for r in a + b)


def _kda() -> KDAState:
    return KDAState(num_slots=1, num_heads=1, head_dim=2, conv_size=2, dtype=torch.float32, device="cpu")


def test_commit_without_a_fresh_history_raises():
    state = _kda()
    slots = torch.tensor([0])
    recurrent = torch.arange(3.0)[None, :, None, None, None].expand(1, 3, 1, 2, 2)  # state after token t = t
    state.keep_recurrent(slots, recurrent)
    state.keep_conv(slots, torch.ones(1, 3, 3, 2, 1))
    state.select(slots, torch.tensor([1]))
    assert torch.equal(state.recurrent[0], torch.full((1, 2, 2), 1.0))
    # the next keep_states step wrote no history (an executor that ignored keep_states): its commit must fail
    with pytest.raises(RuntimeError, match="not written"):
        state.select(slots, torch.tensor([1]))
