"""Planner figures checked against hand arithmetic from the model's config and the chip's catalogue figures:
the rows routed into the busiest expert group when there are fewer sequences than attention groups, a DP
group that spans scale-up domains, a prefill's logits for its last row only, the logits gathered on an
attention group's first rank, and the stand-in drafter's key / value projections."""

from __future__ import annotations

import math

import pytest

from nonstop.plan import predict as predict_module
from nonstop.plan.chips import get_chip
from nonstop.plan.draft import draft_shape
from nonstop.plan.layout import Collective, Layout, collectives, rank_ops, rank_workload
from nonstop.plan.predict import Requests, predict
from nonstop.plan.timing import Constants, collective_time
from nonstop.plan.validation import _workload

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _touched(workload, layout: Layout, batch: int) -> float:
    """Distinct experts the priced rank streams in its first MoE layer."""
    ops = rank_ops(rank_workload(workload, layout), layout, batch, 128, 1)
    return next(op.expert_slices for op in ops if op.expert_slices)


def _hand_max_binomial(n: int, p: float, groups: int) -> float:
    """E[max of ``groups`` independent Binomial(n, p)], summed from the binomial pmf: sum_x P(max > x)."""
    cdf, total = 0.0, 0.0
    for x in range(n):
        cdf += math.comb(n, x) * p**x * (1 - p) ** (n - x)
        total += 1 - cdf**groups
    return total


@pytest.fixture(scope="module")
def kimi_k2():
    return _workload("kimi-k2")


@pytest.fixture(scope="module")
def deepseek_v3():
    return _workload("deepseek-v3")


# ----------------------------------------------------------------------------- fewer sequences than groups


def test_one_sequence_over_two_attention_groups_routes_one_row(kimi_k2):
    """TP4 DP2 with the experts split over the world: one sequence routes one row, so the world streams
    E·(1 − (1 − k/E)^1) = k distinct experts (not the 2 rows of ceil(1/2) per group times 2 groups)."""
    moe = kimi_k2.cfg.moe
    E, k = moe.num_experts, moe.top_k
    assert _touched(kimi_k2, Layout(4, 2), 1) == pytest.approx(E * (1 - (1 - k / E) ** 1))
    assert _touched(kimi_k2, Layout(4, 2), 2) == pytest.approx(E * (1 - (1 - k / E) ** 2))


def test_one_sequence_is_faster_than_two_over_two_attention_groups(kimi_k2):
    chip = get_chip("h200")
    one, two = (predict(kimi_k2, chip, Layout(4, 2), batch=b, context=128).time.total_ms for b in (1, 2))
    assert one < two


def test_expert_parallel_over_two_attention_groups_routes_the_one_row_it_holds(kimi_k2):
    """TP4 DP2 EP8: the expert group spans both attention groups, which hold 1 and 0 sequences."""
    moe = kimi_k2.cfg.moe
    E, k, ep = moe.num_experts, moe.top_k, 8
    p = 1 - (1 - k / E) ** 1
    assert _touched(kimi_k2, Layout(4, 2, 8), 1) == pytest.approx(_hand_max_binomial(E // ep, p, ep))


def test_fewer_expert_ranks_than_tp_gives_the_row_to_rank_zeros_expert_group(kimi_k2):
    """TP16 EP8, one sequence: the attention group's first rank routes its one row (the engine's
    ``owned_rows``), so rank 0's expert group sees a whole row, not the mean half row."""
    moe = kimi_k2.cfg.moe
    E, k, ep = moe.num_experts, moe.top_k, 8
    p = 1 - (1 - k / E) ** 1
    assert _touched(kimi_k2, Layout(16, 1, 8), 1) == pytest.approx(_hand_max_binomial(E // ep, p, ep))


# ----------------------------------------------------------------------------- a DP group across domains


def test_the_dp_all_gather_of_dp_attention_crosses_nodes(deepseek_v3):
    """TP4 DP4 on 16 H100s (8 a node): the dp group {0, 4, 8, 12} puts 2 ranks in each of 2 nodes, so half
    of its bytes cross the scale-out network and its latency counts one hop of each kind."""
    chip, consts = get_chip("h100"), Constants.load()
    layout = Layout(4, 4)
    colls = collectives(rank_workload(deepseek_v3, layout), layout, 256, 1)
    gather = next(c for c in colls if c.kind == "all_gather" and c.label.endswith("(dp)"))
    t = collective_time(gather, chip, consts)
    assert t.crosses_scale_out
    out_bps = chip.out_gbps * 1e9 / chip.devices_per_chip
    assert t.bandwidth_ms == pytest.approx(0.5 * gather.wire_bytes / out_bps * 1e3)
    hop = consts.hop_factor * (chip.up_latency_us * math.log2(2) + chip.out_latency_us * math.log2(2))
    assert t.latency_ms == pytest.approx(gather.count * hop * 1e-3)


@pytest.mark.parametrize("stride, inside", [(1, 8), (4, 2), (8, 1), (16, 1)])
def test_a_strided_group_spans_the_domains_its_ranks_sit_in(stride, inside):
    """16 ranks r, r + stride, ... over 8-rank domains: 8 // stride of them (at least 1) share a domain."""
    chip, consts = get_chip("h100"), Constants.load()
    n = 16
    t = collective_time(Collective("all_gather", n, 1e9, 1, "x", stride=stride), chip, consts)
    domains = n // inside
    hop = consts.hop_factor * (chip.up_latency_us * math.log2(inside) + chip.out_latency_us * math.log2(domains))
    assert t.latency_ms == pytest.approx(hop * 1e-3)
    out_bps = chip.out_gbps * 1e9 / chip.devices_per_chip
    assert t.bandwidth_ms == pytest.approx((1 - inside / n) * 1e9 / out_bps * 1e3)


# ----------------------------------------------------------------------------- logits


def test_a_prefill_step_computes_logits_for_the_last_row_only():
    """llama-3.2-1b alone on a chip: its LM head computes 2·V·d FLOPs for the one row it samples from."""
    llama = _workload("llama-3.2-1b")
    cfg, layout = llama.cfg, Layout()
    ops = rank_ops(rank_workload(llama, layout), layout, 1, 4096, 8192, logit_rows_per_seq=1)
    head = next(op for op in ops if op.kind == "lm_head")
    assert head.flops == pytest.approx(2 * cfg.vocab_size * cfg.hidden_size)


def test_predict_prices_the_prefill_with_the_last_rows_logits(monkeypatch):
    """The prefill's ops and collectives are asked for one logits row a sequence (the decode step's for all)."""
    asked = []
    for name in ("rank_ops", "collectives"):
        real = getattr(predict_module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            asked.append((_name, args[4] if _name == "rank_ops" else args[3], kwargs.get("logit_rows_per_seq")))
            return _real(*args, **kwargs)

        monkeypatch.setattr(predict_module, name, spy)
    predict(_workload("llama-3.2-1b"), get_chip("h100"), Layout(2), requests=Requests(2048, 16))
    assert ("rank_ops", 2048, 1) in asked and ("collectives", 2048, 1) in asked
    assert ("rank_ops", 1, None) in asked


def test_the_first_rank_receives_the_other_vocabulary_parts():
    """TP4: rank 0 gathers 3 of 4 vocabulary parts of fp32 logits per row."""
    llama = _workload("llama-3.2-1b")
    layout, rows = Layout(4), 3
    colls = collectives(rank_workload(llama, layout), layout, rows, 1)
    gather = next(c for c in colls if c.kind == "gather")
    assert gather.wire_bytes == pytest.approx(rows * 3 * llama.cfg.vocab_size / 4 * 4)


# ----------------------------------------------------------------------------- the stand-in drafter


def test_the_stand_in_drafter_has_sixteen_key_value_heads_in_its_weights():
    """K3's stand-in drafter (RedHatAI's shape): 5 layers at d = 7168 with 96 query heads and 16 key / value
    heads of 64, MLP 2·d, 5 taps, Markov rank 256; counted by hand from DSpark's modules."""
    cfg = _workload("kimi-k3").cfg
    d, V, hd, layers, taps, rank = cfg.hidden_size, cfg.vocab_size, 64, 5, 5, 256
    q_heads, kv_heads, inter = 96, 16, 2 * d
    layer = 2 * d + d * q_heads * hd + 2 * d * kv_heads * hd + q_heads * hd * d + 3 * d * inter
    params = taps * d * d + d + d + layers * layer + d + 2 * V * rank
    shape = draft_shape(cfg, None, 7)
    assert shape.params == params
    assert shape.context_bytes_per_token == layers * 2 * kv_heads * hd * 2
