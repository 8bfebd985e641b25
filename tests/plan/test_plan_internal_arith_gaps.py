"""Gaps a mutation audit of the planner's internal arithmetic found: Kimi K3's workload (fp32 KDA state and
bf16 conv windows, MLA latent cache, MXFP4 latent experts, the latent projections production stacks split),
a rank's resident bytes, pipeline sends, a scale-out hop's time, the step's bound and the binomial maximum
of experts touched. Every expected value is hand arithmetic from Kimi K3's config.json (93 layers: 69 KDA,
24 MLA; 96 heads of 128; conv kernel 4; kv_lora 512 + rope 64; 896 experts, top 16, 3,072 wide on a 3,584
latent; hidden 7,168), the format definitions (MXFP4: 4 bits + an E8M0 byte per 32; fp8: 1 byte + an fp32
scale per 128x128) or docs/plan.md's equations."""

from __future__ import annotations

import itertools
import math

import pytest

from nonstop.config import ModelConfig
from nonstop.plan.layout import Collective, Layout, expected_max_binomial, resident_bytes, stage_sends
from nonstop.plan.timing import Constants, StepTime, collective_time
from nonstop.plan.workload import Precision, build_workload
from tests.plan.made_up_chip import made_up_chip

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

KDA_LAYERS, MLA_LAYERS, MOE_LAYERS = 69, 24, 92
HEADS, HEAD_DIM, CONV = 96, 128, 4
LATENT_CACHE = 512 + 64
HIDDEN, LATENT, EXPERT_INTER = 7168, 3584, 3072
MXFP4 = 0.5 + 1 / 32


@pytest.fixture(scope="module")
def k3():
    return build_workload(ModelConfig.preset("kimi-k3"), "kimi-k3")


def _kda_state() -> int:
    """Per sequence: each KDA layer's fp32 recurrent state (heads x D x D) and its bf16 short-conv windows
    (q, k and v, heads x D channels each, kernel - 1 positions)."""
    recurrent = KDA_LAYERS * HEADS * HEAD_DIM * HEAD_DIM * 4
    conv = KDA_LAYERS * 3 * HEADS * HEAD_DIM * (CONV - 1) * 2
    return recurrent + conv


def test_k3_kda_state_is_fp32_recurrent_state_plus_bf16_conv_windows(k3):
    """69 x 96 x 128 x 128 x 4 B (434.1 MB) + 69 x 3 x 12,288 x 3 x 2 B (15.3 MB) = 449,372,160 B held per
    sequence; catches a state read-and-written counted twice (the / 2 dropped) or a wrong conv window."""
    assert _kda_state() == 449_372_160
    assert k3.state_bytes_per_seq() == pytest.approx(_kda_state(), rel=1e-9)


def test_k3_mla_latent_cache_per_token_in_bf16_and_fp8(k3):
    """24 MLA layers cache kv_lora + rope = 576 values a token: 27,648 B in bf16, 576 x 24 x (1 + 4/128^2)
    in fp8; catches a cache format applied to the wrong op kinds or at the wrong width."""
    assert k3.cache_bytes_per_token() == pytest.approx(MLA_LAYERS * LATENT_CACHE * 2, rel=1e-9)
    fp8 = build_workload(k3.cfg, "kimi-k3", Precision(experts="mxfp4", cache="fp8"))
    assert fp8.cache_bytes_per_token() == pytest.approx(MLA_LAYERS * LATENT_CACHE * (1 + 4 / 128**2), rel=1e-9)


def test_k3_routed_experts_are_mxfp4_latent_experts(k3):
    """Each routed expert: gate, up and down of 3,584 x 3,072 (the latent width, not the hidden 7,168):
    33,030,144 params at 4.25 bits (17,547,264 B); catches packed
    4-bit tensors counted as one param a byte, the hidden width, or experts priced in the dense format."""
    assert len(k3.moe_ops) == MOE_LAYERS
    params = 3 * LATENT * EXPERT_INTER
    for op in k3.moe_ops:
        ex = op.expert
        assert (ex.num_experts, ex.local, ex.top_k) == (896, 896, 16)
        assert ex.params_each == params
        assert ex.bytes_each == pytest.approx(params * MXFP4, rel=1e-12)
    held = k3.total_weight_bytes() - sum(op.held_bytes for op in k3.ops)
    assert held == pytest.approx(MOE_LAYERS * 896 * params * MXFP4, rel=1e-12)


@pytest.mark.parametrize("tp", [2, 8])
def test_k3_latent_projections_are_split_tp_ways_only_in_production(k3, tp):
    """Every MoE layer's latent down (7,168 -> 3,584) and up (3,584 -> 7,168) projections, bf16, are whole on
    a nonstop.dist rank; production sharding streams 1/tp of them: the rank streams (1 - 1/tp) x 92 x 2 x
    7,168 x 3,584 x 2 B less. Catches the split left out, applied at the wrong fraction, or skipped at tp 2."""
    replicated = MOE_LAYERS * 2 * HIDDEN * LATENT * 2
    assert sum(op.engine_replicated_bytes for op in k3.ops) == pytest.approx(replicated)
    engine = sum(Layout(tp, sharding="engine").weight_bytes(op) for op in k3.ops)
    production = sum(Layout(tp).weight_bytes(op) for op in k3.ops)
    assert engine == pytest.approx(sum(op.weight_bytes for op in k3.ops))
    assert engine - production == pytest.approx(replicated * (1 - 1 / tp), rel=1e-9)
    held = sum(Layout(tp).weight_bytes(op, held=True) for op in k3.ops)
    assert sum(op.held_bytes for op in k3.ops) - held == pytest.approx(replicated * (1 - 1 / tp), rel=1e-9)


@pytest.mark.parametrize(("batch", "dcp"), [(1, 1), (3, 1), (3, 4)])
def test_k3_resident_state_and_cache_by_hand(k3, batch, dcp):
    """A single device holds every sequence's KDA state once and context x 27,648 B of latent cache, the
    cache split over the dcp ranks of an attention group, and every expert: catches the resident state
    counted twice, DCP's cache split dropped or the experts held counted as all of the model's."""
    context = 1000
    got = resident_bytes(k3, Layout(dcp=dcp), batch, context)
    assert got["state"] == pytest.approx(batch * _kda_state(), rel=1e-9)
    assert got["cache"] == pytest.approx(batch * context * MLA_LAYERS * LATENT_CACHE * 2 / dcp, rel=1e-9)
    experts = MOE_LAYERS * 896 * 3 * LATENT * EXPERT_INTER * MXFP4
    dense_held = sum(op.held_bytes for op in k3.ops)
    assert got["weights"] == pytest.approx(dense_held + experts, rel=1e-12)


# ----------------------------------------------------------------------------- pipeline sends


@pytest.mark.parametrize(
    ("tp", "pp", "domain", "want"),
    [
        (8, 2, 72, [(1, False)]),  # 16 ranks in one NVL72 domain: the one boundary stays inside
        (8, 4, 8, [(3, True)]),  # a stage per 8-rank domain: every boundary crosses
        (4, 4, 8, [(2, False), (1, True)]),  # two stages a domain: only the middle boundary crosses
        (8, 8, 16, [(4, False), (3, True)]),  # 64 ranks over 4 domains of 16: 3 of the 7 boundaries cross
        (16, 2, 8, [(1, True)]),  # a stage spans two domains: still one boundary, one send
    ],
)
def test_pipeline_sends_cross_the_domains_between_stages(tp, pp, domain, want):
    """pp - 1 sends of rows x width bytes; stages placed in rank order cross a scale-up domain boundary
    ceil(world / domain) - 1 times (never more than pp - 1): catches the crossing count and the split."""
    rows, width = 3, HIDDEN * 2
    sends = stage_sends(Layout(tp, pp=pp), domain, rows, width)
    assert [(s.count, s.crosses) for s in sends] == want
    for s in sends:
        assert s.kind == "send" and s.ranks == 2
        assert s.wire_bytes == pytest.approx(s.count * rows * width)


def test_a_single_stage_sends_nothing():
    """Without pipelining there is no send between stages."""
    assert stage_sends(Layout(8), 8, 4, 100) == []


# ----------------------------------------------------------------------------- timing


@pytest.mark.parametrize("devices", [1, 2])
def test_a_send_between_domains_is_one_scale_out_hop(devices):
    """A crossing send: count x hop_factor x out latency, and its bytes at the scale-out bandwidth a rank
    gets (out_gbps / devices per chip): catches the scale-up latency or the whole chip's bandwidth used."""
    consts = Constants(1.0, 1.0, 1.0, 0.0, 1.5, 0.0)
    c = Collective("send", 2, 6e6, 3, "x", crosses=True)
    t = collective_time(c, made_up_chip(devices_per_chip=devices), consts)
    assert t.latency_ms == pytest.approx(3 * 1.5 * 10.0 * 1e-3)
    assert t.bandwidth_ms == pytest.approx(6e6 / (50e9 / devices) * 1e3)
    assert t.crosses_scale_out


def test_a_group_inside_one_domain_is_scale_up_only():
    """4 contiguous ranks in a domain of 8: latency hop_factor x up latency x log2 4, bytes at the scale-up
    bandwidth, not marked as crossing: catches the scale-out share or the crossing flag computed wrongly."""
    consts = Constants(1.0, 1.0, 1.0, 0.0, 1.5, 0.0)
    t = collective_time(Collective("all_reduce", 4, 9e6, 2, "x"), made_up_chip(), consts)
    assert t.latency_ms == pytest.approx(2 * 1.5 * 2.0 * 2 * 1e-3)
    assert t.bandwidth_ms == pytest.approx(9e6 / 900e9 * 1e3)
    assert not t.crosses_scale_out


def test_a_group_over_two_domains_is_bound_by_its_scale_out_share():
    """16 contiguous ranks over two domains of 8: half the bytes leave the domain, at 50 GB/s, which is
    slower than the other half at 900 GB/s; latency log2 8 up hops + log2 2 out hops."""
    consts = Constants(1.0, 1.0, 1.0, 0.0, 1.0, 0.0)
    t = collective_time(Collective("all_reduce", 16, 8e6, 1, "x"), made_up_chip(), consts)
    assert t.bandwidth_ms == pytest.approx(0.5 * 8e6 / 50e9 * 1e3)
    assert t.latency_ms == pytest.approx((2.0 * 3 + 10.0 * 1) * 1e-3)
    assert t.crosses_scale_out


@pytest.mark.parametrize(
    ("parts", "bound"),
    [
        (dict(weights_ms=2.0, state_ms=1.0), "HBM bandwidth (weights)"),
        (dict(weights_ms=1.0, state_ms=2.0), "HBM bandwidth (KV/KDA state)"),
        (dict(weights_ms=1.0, state_ms=1.0, compute_ms=2.5), "compute"),
        (dict(weights_ms=1.0, launch_ms=0.5, expert_fetch_ms=1.0), "launch/sync overhead"),
        (dict(weights_ms=1.0, host_ms=0.6, expert_fetch_ms=0.6), "launch/sync overhead"),
        (dict(weights_ms=1.0, draft_ms=1.5), "speculative draft"),
    ],
)
def test_the_bound_is_the_largest_group_by_hand(parts, bound):
    """docs/plan.md: memory (weights + state, named by the larger), compute, collectives, launch/sync (launch
    gaps + host loop + expert fetch latency) and the drafter: catches a group's members or label swapped."""
    assert StepTime(**parts).bound() == bound


def test_the_collective_bound_names_latency_or_bandwidth_by_the_larger():
    """Collectives whose latency exceeds their bandwidth time are latency-bound, and the reverse."""
    from nonstop.plan.timing import CollectiveTime

    lat = StepTime(weights_ms=0.1, collectives=[CollectiveTime("x", "all_reduce", 8, 1, 1.0, 2.0, 1.0, False)])
    bw = StepTime(weights_ms=0.1, collectives=[CollectiveTime("x", "all_reduce", 8, 1, 1.0, 1.0, 2.0, False)])
    assert lat.bound() == "collective latency"
    assert bw.bound() == "collective bandwidth"


# ----------------------------------------------------------------------------- experts touched


@pytest.mark.parametrize(("n", "p", "groups"), [(3, 0.4, 2), (4, 0.25, 3), (2, 0.9, 4), (5, 0.5, 1)])
def test_the_expected_maximum_of_binomials_by_enumeration(n, p, groups):
    """E[max of groups independent Binomial(n, p)], summed over every joint outcome by plain loops: catches a
    wrong power of the CDF in the tail sum."""
    pmf = [math.comb(n, x) * p**x * (1 - p) ** (n - x) for x in range(n + 1)]
    want = sum(max(xs) * math.prod(pmf[x] for x in xs) for xs in itertools.product(range(n + 1), repeat=groups))
    assert expected_max_binomial(n, p, groups) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_certain_experts_are_touched_exactly(p):
    """p = 1 (every expert touched) or 0 (none): n x p whatever the groups, with no division by 1 - p."""
    assert expected_max_binomial(7, p, 4) == 7 * p
