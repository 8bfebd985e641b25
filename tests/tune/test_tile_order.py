"""The search proposer's tile-order tunable: each order is a permutation of the tiles, the candidates that
carry one pass the whole verification, and an order that is not a permutation is rejected by it."""

from __future__ import annotations

import pytest

from nonstop.tune import tile_order
from nonstop.tune.search import SearchProposer
from nonstop.tune.verify import verify
from tests.tune.helpers import tiny_target


def _tiles(expr: str, n: int) -> list[int]:
    return [eval(expr.replace("tl.program_id(0)", str(p)).replace("tl.num_programs(0)", str(n))) for p in range(n)]


@pytest.mark.parametrize("order", sorted(tile_order.ORDERS))
def test_orders_are_permutations(order):
    for n in range(1, 40):
        assert sorted(_tiles(tile_order.ORDERS[order], n)) == list(range(n)), n


def test_single_phase_launchers_get_tile_orders_two_phase_ones_do_not():
    assert {"tile_order": "reversed"} in SearchProposer("moe_tail").moves()
    assert not any("tile_order" in m for m in SearchProposer("moe_experts").moves())  # its tiles follow tickets


@pytest.mark.parametrize("order", sorted(tile_order.ORDERS))
def test_tile_order_candidates_are_accepted(order):
    """On embed: its grid is one program per row, so the order matters in every case (at tiny widths the
    interpreter's block sizes leave most other kinds a single tile)."""
    source = SearchProposer("embed").source({"tile_order": order})
    assert f"embed_kernel_{order}[" in source and tile_order.ORDERS[order] in source
    verdict = verify(source, tiny_target("embed"), timeout_s=300)
    assert verdict.accepted, verdict.reasons


def test_an_order_that_is_not_a_permutation_is_rejected(monkeypatch):
    monkeypatch.setitem(tile_order.ORDERS, "halved", "tl.program_id(0) // 2")  # rows 0, 0, 1, 1 ...: half skipped
    source = SearchProposer("embed").source({"tile_order": "halved"})
    verdict = verify(source, tiny_target("embed"), timeout_s=300)
    assert not verdict.accepted and verdict.stage == "dynamic", verdict.reasons
    assert "differ from the twin" in verdict.reasons[0] or "NaN" in verdict.reasons[0], verdict.reasons
