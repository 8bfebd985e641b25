"""Gaps a mutation audit of ``dist/layout.py`` found (no process group): integer-only sizes, a rank's expert
group, per-layer placements (looked up by layer, checked against the model's expert count, kept by
``with_placement``) and the layout's one-line description, written out by hand for two layouts."""

from __future__ import annotations

import pytest

from nonstop.dist import ExpertPlacement, Layout, LayoutError


@pytest.mark.parametrize("flag, kwargs", [("--tp", {"tp": 2.0, "world": 2}), ("--ep", {"ep": 2.0, "world": 2})])
def test_sizes_must_be_integers(flag, kwargs):
    """2.0 ranks is no layout: a float tp made a Layout whose groups are ranges of floats."""
    with pytest.raises(LayoutError, match=f"{flag} must be a positive integer, got 2.0"):
        Layout.make(**kwargs)


def test_a_ranks_expert_group_is_its_block_of_ep_consecutive_ranks():
    lay = Layout.make(tp=1, ep=2, world=6)  # expert groups {0,1} {2,3} {4,5}
    assert [lay.ep_group(r) for r in range(6)] == [(0, 1), (0, 1), (2, 3), (2, 3), (4, 5), (4, 5)]
    assert all(r in lay.ep_group(r) for r in range(6))


def test_per_layer_placements_are_found_by_layer():
    first, second = ExpertPlacement(8, ((0, 1, 2, 3, 4, 5), (6, 7))), ExpertPlacement(8, ((0,), tuple(range(1, 8))))
    lay = Layout.make(1, 2, placement={1: first, 2: second})
    assert lay.placement_for(1, 8) is first and lay.placement_for(2, 8) is second
    assert lay.placement_for(3, 8) == ExpertPlacement.even(8, 2)  # a layer without one: spread evenly


def test_a_placement_for_another_expert_count_is_refused():
    lay = Layout.make(1, 2, placement=ExpertPlacement.even(8, 2))
    with pytest.raises(LayoutError, match="covers 8 experts on 2 ranks; the model has 16 experts"):
        lay.placement_for(0, 16)


def test_with_placement_holds_the_new_placement():
    new = ExpertPlacement(8, ((0, 1), tuple(range(2, 8))))
    lay = Layout.make(2, 2, world=4).with_placement({1: new})
    assert (lay.tp, lay.ep, lay.world) == (2, 2, 4)
    assert lay.placement_for(1, 8) is new


def test_describe_names_the_groups():
    assert Layout.make(tp=2, ep=4).describe() == (
        "tp 2 x ep 4 on 4 ranks: 2 attention groups of 2 ranks (data-parallel); experts split over 4 ranks"
    )
    assert Layout.make(tp=4, ep=2).describe() == (
        "tp 4 x ep 2 on 4 ranks: 1 attention group of 4 ranks; experts split over 2 ranks "
        "(2 expert groups, each holding every expert)"
    )
    assert Layout.make(tp=1, ep=2, world=6).describe().endswith("(3 expert groups, each holding every expert)")


def test_describe_of_a_model_without_routed_experts_splits_no_experts():
    """``nonstop generate --model llama --ep 2`` said "experts split over 2 ranks" of a model that has none (its
    ep ranks hold the same dense weights); the line now says there are no routed experts to split."""
    line = Layout.make(tp=1, ep=2).describe(routed_experts=False)
    assert line == "tp 1 x ep 2 on 2 ranks: 2 attention groups of 1 rank (data-parallel); no routed experts to split"
    assert "expert groups" not in Layout.make(tp=4, ep=2).describe(routed_experts=False)
