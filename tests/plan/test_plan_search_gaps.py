"""Gaps a mutation audit of ``nonstop plan``'s layout search found: which layouts are candidates (heads and KV
heads divide, as many stages as layers, the requested sharding kept), the quick bound by hand, the search's
fit flags and order against full predictions, how layouts are named, and a few per-rank rows and bytes.
Expected values are hand arithmetic from the models' configs and the formulas in the modules' docstrings."""

from __future__ import annotations

import dataclasses

import pytest

from nonstop.config import ModelConfig, preset_hf_dict
from nonstop.plan.chips import get_chip
from nonstop.plan.layout import (
    Layout,
    busiest_expert_group_rows,
    check_layout,
    rank_ops,
)
from nonstop.plan.predict import USABLE_HBM, predict
from nonstop.plan.search import candidate_layouts, lower_bound_bytes, search
from nonstop.plan.workload import PlanError, build_workload

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def nano():
    return build_workload(ModelConfig.preset("k3-nano"), "k3-nano")


@pytest.fixture(scope="module")
def llama():
    return build_workload(ModelConfig.preset("llama-3.2-1b"), "llama-3.2-1b")


@pytest.fixture(scope="module")
def gqa24():
    """Llama 3.2 1B's shapes with 24 query heads and 6 KV heads: heads split 1, 2, 3, 6, 8, 12 or 24 ways, and
    a split must divide the 6 KV heads or be a multiple of them."""
    hf = preset_hf_dict("llama-3.2-1b")
    hf.update(num_attention_heads=24, num_key_value_heads=6, head_dim=64)
    return build_workload(ModelConfig.from_hf_dict(hf), "gqa24")


def _want(ranks: int, heads: int, kv_heads: int | None, layers: int) -> set:
    """Every (tp, dp, ep, pp) of a dense model by hand: pp in 1, 2, 4, 8 dividing the ranks (at most the
    layers), tp dividing a stage and the query heads, and (GQA) the KV heads dividing tp or tp dividing them."""
    out = set()
    for pp in (1, 2, 4, 8):
        if ranks % pp or pp > layers:
            continue
        stage = ranks // pp
        for tp in range(1, stage + 1):
            if stage % tp or heads % tp:
                continue
            if kv_heads is not None and kv_heads % tp and tp % kv_heads:
                continue
            out.add((tp, stage // tp, 1, pp))
    return out


def test_the_search_splits_heads_three_and_six_ways_where_the_kv_heads_allow(gqa24):
    """search.py tries every divisor of a stage's ranks as tp, not only powers of two, and drops a tp that
    neither divides nor is a multiple of the KV heads (12 ranks: tp 4 splits 24 query heads but not 6 KV
    heads). Catches a search restricted to power-of-two splits, and one that skips the head checks."""
    got = {(lay.tp, lay.dp, lay.ep, lay.pp) for lay in candidate_layouts(gqa24, 12)}
    want = _want(12, 24, 6, 16)
    assert got == want
    assert {tp for tp, _, _, pp in want if pp == 1} == {
        1,
        2,
        3,
        6,
        12,
    }  # 4 refused: 6 KV heads
    assert len(want) == 11  # stages of 12, 6, 3 ranks: 5 + 4 + 2


def test_the_search_never_splits_heads_more_ways_than_there_are(nano):
    """k3-nano has 4 MLA / KDA heads: on 8 ranks no candidate has tp 8 (a rank would hold half a head), and
    with pp 8 every one of its 8 layers is a stage of its own (pp = layers is allowed, pp > layers is not).
    Catches the head check dropped from ``check_layout`` and pp = layers refused."""
    layouts = candidate_layouts(nano, 8)
    assert layouts and max(lay.tp for lay in layouts) == 4
    assert {lay.pp for lay in layouts} == {1, 2, 4, 8}
    assert Layout(1, 1, 1, "production", 8) in layouts
    with pytest.raises(PlanError, match="--tp 8 must divide"):
        check_layout(nano, Layout(8))


def test_the_search_plans_the_sharding_it_is_asked_for(nano):
    """``search(..., sharding="engine")`` (the command's ``--sharding engine`` without a layout) must plan every
    candidate with nonstop.dist's own parts, not production's. Catches the sharding dropped from the
    candidates."""
    cands = search(nano, get_chip("h200"), 2, batch=1, context=64, sharding="engine")
    assert cands and {c.layout.sharding for c in cands} == {"engine"}
    assert all(c.prediction is None or c.prediction.layout.sharding == "engine" for c in cands)


def test_the_quick_bound_by_hand():
    """kimi-linear-48b-a3b (27 layers, MLA + KDA + MoE) as TP2 DP2 (experts TP over 4 ranks) PP2, 3
    sequences at 1,000 tokens: the fullest attention group holds ceil(3/2) = 2 sequences, the fullest stage
    ceil(27/2) = 14 of 27 layers; dense weights / tp, experts / 4, KDA state / tp, the MLA latent whole.
    Catches floor instead of ceil for the sequences, the state split over the world, and 1/pp instead of the
    fullest stage's share."""
    w = build_workload(ModelConfig.preset("kimi-linear-48b-a3b"), "kimi-linear-48b-a3b")
    dense = sum(op.weight_bytes for op in w.ops)
    experts = sum(op.expert.bytes_each * op.expert.num_experts for op in w.moe_ops)
    state = sum(op.state_bytes_per_seq for op in w.ops) / 2  # read and written each step
    cache = sum(op.cache_bytes_per_seq_ctx for op in w.ops)
    assert state > 0 and cache > 0 and experts > 0
    want = (dense / 2 + experts / 4 + 2 * state / 2 + 2 * 1000 * cache) * 14 / 27
    got = lower_bound_bytes(w, Layout(2, 2, 1, "production", 2), 3, 1000)
    assert got == pytest.approx(want, rel=1e-12)


def test_the_search_agrees_with_full_predictions_and_ranks_the_fitting_by_ms_per_token(nano):
    """On a chip whose usable memory (92% of its HBM) lies among k3-nano's 4-rank layouts' bytes: a candidate
    fits exactly when its full prediction does, only layouts whose quick bound exceeds a rank's usable memory
    are dropped unpredicted (one whose bound lies between the usable memory and the whole HBM among them), the
    fitting come first, fastest first, and the first is the least ms/token of all fitting layouts. Catches
    layouts dropped below the capacity, and the capacity taken as the whole HBM rather than its usable share."""
    batch, context = 3, 64
    h200 = get_chip("h200")
    exact = {lay: predict(nano, h200, lay, batch, context) for lay in candidate_layouts(nano, 4)}
    bounds = sorted(lower_bound_bytes(nano, lay, batch, context) for lay in exact)
    usable = 0.97 * bounds[-3]  # the third-largest bound lies between the usable memory and the whole HBM
    assert usable < bounds[-3] <= usable / USABLE_HBM
    assert min(p.bytes_per_rank for p in exact.values()) < usable
    hbm_gb = usable / USABLE_HBM / 1e9
    chip = dataclasses.replace(h200, hbm_gb=hbm_gb, hbm_visible_gb=hbm_gb)
    cands = search(nano, chip, 4, batch=batch, context=context)
    assert {c.layout for c in cands} == set(exact)
    for c in cands:
        assert c.fits == (exact[c.layout].bytes_per_rank <= usable), c.layout.describe()
        dropped = lower_bound_bytes(nano, c.layout, batch, context) > usable
        assert (c.prediction is None) == dropped, c.layout.describe()
    fitting = [c for c in cands if c.fits]
    assert fitting and cands[: len(fitting)] == fitting
    ms = [c.prediction.ms_per_token for c in fitting]
    assert ms == sorted(ms)
    assert ms[0] == min(p.ms_per_token for p in exact.values() if p.bytes_per_rank <= usable)


def test_layout_names():
    """The report names a layout by what it splits: a single device is "TP1", experts split inside one
    attention group "experts TP", DP attention with experts over the world "experts TP<world>", expert
    parallelism "EP<n>". Catches the DP-attention or the experts-TP mode taken for a layout without them."""
    assert Layout().describe() == "TP1"
    assert Layout(4).describe() == "TP4 experts TP"
    assert Layout(4).describe(routed_experts=False) == "TP4"
    assert Layout(2, 2).describe() == "TP2 DP2 experts TP4"
    assert Layout(4, 1, 4).describe() == "TP4 EP4"
    assert Layout(1, 1, 1, "production", 4).describe() == "TP1 PP4"
    assert not Layout().moe_world_tp and not Layout().expert_tp and not Layout(4).moe_world_tp


def test_experts_split_over_the_world_route_every_verify_row():
    """DP attention with the experts TP over the world (TP1 DP2 EP1): the experts see every row of the batch,
    3 sequences x 4 verify rows (3 drafts + the current token) = 12, not one row a sequence. Catches the
    verify rows left out of the routed rows."""
    assert busiest_expert_group_rows(Layout(1, 2, 1), 3, 4) == 12
    assert busiest_expert_group_rows(Layout(1, 2, 1), 3, 1) == 3
    assert busiest_expert_group_rows(Layout(2, 1, 1), 3, 4) == 12  # experts TP in the one group: its rows


def test_a_batch_split_unevenly_over_attention_groups_steps_as_the_fullest_group(llama):
    """3 sequences over 2 attention groups: the fullest group holds 2, and every step waits for it, so the
    step takes as long as 4 sequences' (2 a group) and longer than 2 sequences' (1 a group); a rank holds the
    cache of 2 sequences. Catches floor(batch / dp) for a rank's sequences."""
    chip = get_chip("h200")
    three, four, two = (predict(llama, chip, Layout(1, 2), b, 2048) for b in (3, 4, 2))
    assert three.time.total_ms == pytest.approx(four.time.total_ms, rel=1e-12)
    assert three.time.total_ms > two.time.total_ms
    assert three.resident["cache"] == pytest.approx(four.resident["cache"], rel=1e-12)
    assert three.resident["cache"] == pytest.approx(2 * two.resident["cache"], rel=1e-12)


def test_verify_rows_read_a_sequences_kda_state_once(nano):
    """workload.py: bytes = W + r·a + s·S + s·L·c; a sequence's KDA state is read once a step however many of
    its rows (verified drafts) the step runs, so 2 sequences of 4 rows differ from 2 of 1 row only by the
    activations of 6 more rows. Catches the state read per row."""
    one = rank_ops(nano, Layout(), 2, 64, 1)
    four = rank_ops(nano, Layout(), 2, 64, 4)
    shapes = {op.name: op for op in nano.ops}
    checked = 0
    for a, b in zip(one, four):
        op = shapes[a.name]
        if op.state_bytes_per_seq and op.expert is None:
            assert b.state_bytes - a.state_bytes == pytest.approx(6 * op.act_bytes_per_row), a.name
            checked += 1
    assert checked >= 4  # every KDA layer of k3-nano


def test_decode_context_parallel_of_gqa_stops_at_the_kv_head_copies(llama):
    """Llama 3.2 1B's 8 KV heads over --tp 8: each head is kept once, so there is no copy to split its tokens
    over and --dcp 2 is refused (--tp 16 keeps 2 copies: --dcp 2 is planned). Catches the limit off by one."""
    chip = get_chip("h200")
    with pytest.raises(PlanError, match="--dcp at most 1"):
        predict(llama, chip, Layout(8, 1, 1, "production", 1, 2), 1, 1024)
    assert predict(llama, chip, Layout(16, 1, 1, "production", 1, 2), 1, 1024).layout.dcp == 2


def test_a_zero_dcp_is_refused_as_a_plan_error(nano):
    """The Python API refuses a layout size below 1 with the planner's one-line error rather than a division
    by zero deep in the rank ops. Catches the ``>= 1`` check weakened to ``>= 0``."""
    for field in ("tp", "dp", "ep", "dcp"):
        with pytest.raises(PlanError, match=f"--{field} must be >= 1, got 0"):
            predict(
                nano,
                get_chip("h200"),
                dataclasses.replace(Layout(), **{field: 0}),
                1,
                64,
            )


def test_mean_context_of_a_request(nano):
    """predict.py: the mean cached tokens over a request's decode steps are input + output // 2."""
    from nonstop.plan.predict import Requests

    assert Requests(100, 31).context == 115
    assert Requests(1, 1).context == 1


def test_the_router_streams_in_bf16_beside_fp8_weights(nano):
    """workload.py: the router is served in bf16 whatever the dense format; k3-nano's first MoE layer in fp8
    streams its [8, 256] router at 2 bytes a parameter and its latent_down [128, 256] and shared gate/up
    [256, 256] at 1 + 4/128² bytes (fp8 with fp32 128x128 block scales). Catches the router priced as fp8."""
    from nonstop.plan.workload import Precision

    fp8 = build_workload(nano.cfg, "k3-nano", Precision("fp8", "mxfp4"))
    front = next(op for op in fp8.ops if op.kind == "moe_front")
    assert front.weight_bytes == pytest.approx(8 * 256 * 2 + (128 * 256 + 256 * 256) * (1 + 4 / 128**2), rel=1e-12)


@pytest.mark.parametrize("pp", [0, -1])
def test_a_pipeline_of_no_stages_is_refused(pp):
    """``Layout(pp=0)`` divided by zero and ``pp=-1`` was planned at negative bytes per rank that "fit"
    (the command line takes only positive --pp; the Python API did not check)."""
    workload = build_workload(ModelConfig.preset("k3-nano"), "k3-nano")
    with pytest.raises(PlanError, match=f"--pp must be >= 1, got {pp}"):
        predict(workload, get_chip("h200"), Layout(pp=pp), 1, 64)
