"""The layout search's quick bound and the planner API's refusal of impossible sequences."""

from __future__ import annotations

import dataclasses

import pytest

from nonstop.config import ModelConfig
from nonstop.plan.chips import get_chip
from nonstop.plan.layout import Layout
from nonstop.plan.predict import Requests, predict
from nonstop.plan.search import candidate_layouts, lower_bound_bytes, search
from nonstop.plan.workload import PlanError, build_workload


@pytest.mark.parametrize(
    ("name", "ranks", "batch", "context", "mla_cache_heavy"),
    [
        ("kimi-linear-48b-a3b", 4, 13, 60001, True),  # MLA + KDA + MoE, the cache up to a quarter of a rank
        ("llama-3.2-1b", 4, 11, 30001, False),  # GQA: the cache splits over TP by its KV heads
        ("k3-nano", 4, 7, 2047, False),  # K3's blocks at toy width
    ],
)
def test_the_quick_bound_never_exceeds_a_layouts_bytes_and_counts_the_replicated_mla_cache(
    name, ranks, batch, context, mla_cache_heavy
):
    """The search drops a layout on its bound without predicting it, so the bound must never exceed what the
    full prediction holds (or a fitting layout would be lost). An MLA latent cache is kept whole by every
    rank of an attention group: where that cache is a large share of a rank's bytes the bound must follow it,
    not divide it by TP (which once printed 'needs >= 540 GB' beside 2,962 GB)."""
    workload = build_workload(ModelConfig.preset(name), name)
    chip = get_chip("h200")
    checked_cache_heavy = 0
    for layout in candidate_layouts(workload, ranks):
        bound = lower_bound_bytes(workload, layout, batch, context)
        p = predict(workload, chip, layout, batch, context)
        assert bound <= p.bytes_per_rank * (1 + 1e-9), layout.describe()
        if mla_cache_heavy and p.resident["cache"] > 0.2 * p.bytes_per_rank:
            assert bound >= 0.95 * p.bytes_per_rank, layout.describe()
            checked_cache_heavy += 1
    assert checked_cache_heavy >= 2 or not mla_cache_heavy


def test_predict_refuses_a_sequence_beyond_the_models_positions():
    """The position check lives in ``predict`` (a Python caller is refused as the command is); the default
    context is capped at the model's positions, and exactly the limit is planned."""
    nano = build_workload(ModelConfig.preset("k3-nano"), "k3-nano")
    limit = nano.cfg.max_position_embeddings
    chip = get_chip("h200")
    assert predict(nano, chip, Layout(1)).context == min(4096, limit)
    assert predict(nano, chip, Layout(1), context=limit).fits
    assert predict(nano, chip, Layout(1), requests=Requests(limit - 17, 17)).context == limit - 17 + 8
    with pytest.raises(PlanError, match=f"{limit + 1:,} tokens exceeds k3-nano's {limit:,} positions"):
        predict(nano, chip, Layout(1), context=limit + 1)
    with pytest.raises(PlanError, match="positions"):
        predict(nano, chip, Layout(1), requests=Requests(limit, 1))


def test_when_no_layout_fits_the_first_is_the_one_with_the_least_exact_bytes():
    """The report calls the first candidate "the smallest layout" when none fits: it must hold the fewest
    bytes a rank of all candidates by the full prediction, not merely have the least quick bound (a
    pipelined layout's fuller stage and unsplit vectors make the two orders differ)."""
    workload = build_workload(ModelConfig.preset("kimi-linear-48b-a3b"), "kimi-linear-48b-a3b")
    tiny = dataclasses.replace(get_chip("h200"), hbm_gb=4.0, hbm_visible_gb=4.0)  # nothing fits in 4 GB
    cands = search(workload, tiny, 8, batch=3, context=4001)
    assert cands and not any(c.fits for c in cands)
    exact = {c.layout: predict(workload, tiny, c.layout, 3, 4001).bytes_per_rank for c in cands}
    assert exact[cands[0].layout] == min(exact.values())
    assert cands[0].prediction is not None and cands[0].bytes_per_rank == exact[cands[0].layout]
    for c in cands:  # a layout shown with its exact bytes matches the prediction; the rest show a lower bound
        assert c.bytes_per_rank <= exact[c.layout] * (1 + 1e-9), c.layout.describe()
