"""Gaps a second mutation audit of ``engine/layout_preflight.py`` found: the cache slots a rank keeps (slot s
belongs to attention group s mod DP; every rank of a group keeps its group's slots), counted by hand."""

from __future__ import annotations

import pytest

from nonstop.dist.layout import Layout
from nonstop.engine.layout_preflight import rank_slots


@pytest.mark.parametrize("slots, want", [(5, [3, 3, 2, 2]), (1, [1, 1, 1, 1]), (4, [2, 2, 2, 2])])
def test_every_rank_of_an_attention_group_keeps_its_groups_slots(slots, want):
    """tp 2 over 4 ranks: groups {0, 1} and {2, 3}. With 5 slots group 0 holds slots 0, 2, 4 and group 1
    slots 1, 3, so ranks 0 and 1 keep 3 caches each and ranks 2 and 3 keep 2; a rank keeps at least one.
    Catches a rank's slots counted from its global rank instead of its group (rank 1 counted as group 1:
    2 caches, its memory under-counted)."""
    layout = Layout.make(tp=2, ep=1, world=4)
    assert [rank_slots(layout, r, slots) for r in range(4)] == want
