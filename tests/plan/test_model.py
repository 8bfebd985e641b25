"""The planner's model side (Program costs, nonstop.dist rank Programs) and its time model."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.plan.chips import get_chip
from nonstop.plan.layout import (
    Collective,
    Layout,
    expected_max_binomial,
    experts_touched,
    rank_ops,
    rank_workload,
    resident_bytes,
)
from nonstop.plan.predict import Spec, predict
from nonstop.plan.timing import Constants, collective_time
from nonstop.plan.workload import Precision, build_workload


@pytest.fixture(scope="module")
def k3():
    return build_workload(ModelConfig.preset("kimi-k3"), "kimi-k3")


@pytest.fixture(scope="module")
def nano():
    return build_workload(ModelConfig.preset("k3-nano"), "k3-nano")


def test_k3_sizes_match_the_reference_notes(k3):
    """kimi-k3.md 10: ~137 GB read per token at batch 1, 1.56 TB checkpoint, KDA state 449 MB per
    sequence (distributed.md 0), MLA latent 24 layers x 576 x bf16 per token."""
    assert k3.precision == Precision("bf16", "mxfp4", "bf16")
    assert k3.active_weight_bytes() == pytest.approx(137e9, rel=0.02)
    assert k3.total_weight_bytes() == pytest.approx(1.5609e12, rel=0.01)
    assert k3.state_bytes_per_seq() == pytest.approx(449e6, rel=0.01)
    assert k3.cache_bytes_per_token() == 24 * 576 * 2


def test_k2_is_priced_in_its_released_fp8():
    cfg = ModelConfig.preset("kimi-k2")
    k2 = build_workload(cfg, "kimi-k2")
    assert k2.precision.dense == "fp8" and k2.precision.experts == "fp8"
    assert k2.active_weight_bytes() == pytest.approx(32.5e9, rel=0.05)  # ~32B active params, 1 byte each
    bf16 = build_workload(cfg, "kimi-k2", Precision("bf16", "bf16"))
    head = 2 * cfg.vocab_size * cfg.hidden_size  # the LM head: bf16 in both (the fp8 release keeps it so)
    assert bf16.active_weight_bytes() - head == pytest.approx(2 * (k2.active_weight_bytes() - head), rel=0.01)


@pytest.mark.parametrize(
    "layout", [Layout(1), Layout(2, 1, 1, "engine"), Layout(2, 2, 4, "engine"), Layout(4, 1, 2, "engine")]
)
def test_rank_weights_equal_nonstop_dist(nano, layout):
    """Engine sharding: a rank's weights are exactly the parts nonstop.dist gives it (an independent count
    over the checkpoint layout)."""
    from nonstop.dist.model import rank_weight_bytes

    rank = rank_workload(nano, layout)
    ref = rank_weight_bytes(nano.cfg, layout.dist_layout(), torch.bfloat16)[0]
    assert resident_bytes(rank, layout, 1, 0)["weights"] == pytest.approx(ref, rel=0.01)


def test_production_sharding_splits_the_latent_projections(k3):
    engine, production = Layout(16, 1, 16, "engine"), Layout(16, 1, 16)
    rank = rank_workload(k3, engine)
    latent = 2 * 92 * 3584 * 7168 * 2  # down + up, bf16
    diff = resident_bytes(rank, engine, 1, 0)["weights"] - resident_bytes(rank, production, 1, 0)["weights"]
    assert diff == pytest.approx(latent * (1 - 1 / 16), rel=0.01)


def test_expected_max_binomial_matches_sampling():
    rng = random.Random()
    for _ in range(3):
        n, p, groups = rng.randint(3, 40), rng.uniform(0.02, 0.6), rng.randint(2, 9)
        draws = [max(sum(rng.random() < p for _ in range(n)) for _ in range(groups)) for _ in range(3000)]
        sampled = sum(draws) / len(draws)
        assert expected_max_binomial(n, p, groups) == pytest.approx(sampled, rel=0.05, abs=0.05)
    assert expected_max_binomial(10, 0.3, 1) == pytest.approx(3.0)


def test_experts_touched_grows_with_the_batch_and_saturates():
    counts = [experts_touched(896, 16, rows, 896, 1) for rows in (1, 2, 8, 64, 4096)]
    assert counts[0] == pytest.approx(16)
    assert all(a < b for a, b in itertools.pairwise(counts))
    assert counts[-1] == pytest.approx(896, rel=1e-6)
    assert experts_touched(896, 16, 1, 112, 8) > 16 / 8  # the busiest of 8 ranks holds more than the mean


def test_a_collective_past_the_scale_up_domain_pays_scale_out():
    h200, consts = get_chip("h200"), Constants.load()
    inside = collective_time(Collective("all_reduce", 8, 1e6, 10, "x"), h200, consts)
    across = collective_time(Collective("all_reduce", 16, 1e6, 10, "x"), h200, consts)
    assert not inside.crosses_scale_out and across.crosses_scale_out
    assert across.latency_ms > inside.latency_ms
    assert across.bandwidth_ms == pytest.approx(0.5 * 1e6 / (h200.out_gbps * 1e9) * 1e3)
    assert inside.bandwidth_ms == pytest.approx(1e6 / (h200.up_gbps * 1e9) * 1e3)


def test_speculative_step_verifies_k_plus_one_rows(k3):
    b300 = get_chip("b300")
    plain = predict(k3, b300, Layout(8), batch=1, context=1024)
    rows8 = predict(k3, b300, Layout(8), batch=8, context=1024)
    spec = predict(k3, b300, Layout(8), batch=1, context=1024, spec=Spec(4.0, 7))
    assert spec.time.draft_ms > 0
    assert spec.time.weights_ms == pytest.approx(rows8.time.weights_ms, rel=0.02)  # 8 rows touch what batch 8 does
    assert spec.ms_per_token == pytest.approx(spec.time.total_ms / 4.0)
    assert spec.time.total_ms > plain.time.total_ms and spec.ms_per_token < plain.ms_per_token
    with pytest.raises(ValueError, match="spec-accept"):
        Spec(9.0, 7)


def test_verified_drafts_share_their_sequences_cache_reads(k3):
    """The K+1 rows a speculative step verifies per sequence read its cached keys once: a rank's cache
    traffic grows with the context as without speculation (rows add their own activations only)."""
    layout = Layout(8)
    rank = rank_workload(k3, layout)

    def traffic(rows_per_seq, context):
        return sum(op.state_bytes for op in rank_ops(rank, layout, 4, context, rows_per_seq))

    per_context_plain = traffic(1, 65536) - traffic(1, 1024)
    per_context_spec = traffic(8, 65536) - traffic(8, 1024)
    assert per_context_plain == pytest.approx(4 * 64512 * rank.cache_bytes_per_token(), rel=1e-9)
    assert per_context_spec == pytest.approx(per_context_plain, rel=1e-9)


def test_megakernel_launches_once_and_breakdown_adds_up(k3):
    tpu = get_chip("tpu-v7")
    mk = predict(k3, tpu, Layout(32), batch=2, context=1024, executor="megakernel")
    kern = predict(k3, tpu, Layout(32), batch=2, context=1024, executor="kernels")
    assert mk.time.kernels == 1 and kern.time.kernels > 700
    overhead = kern.time.launch_ms + kern.time.host_ms - mk.time.launch_ms - mk.time.host_ms
    assert mk.time.host_ms == 0 and kern.time.host_ms > 0  # one kernel per step: no host loop between ops
    assert kern.time.total_ms - mk.time.total_ms == pytest.approx(overhead)
    out = mk.to_json()
    assert sum(out["breakdown_ms"].values()) == pytest.approx(out["step_ms"])
    assert out["chips"] == 16 and out["bytes_per_chip"] == pytest.approx(2 * mk.bytes_per_rank)


def test_more_context_reads_more_cache_and_stops_fitting(k3):
    h200 = get_chip("h200")
    short = predict(k3, h200, Layout(16), batch=8, context=1024)
    long = predict(k3, h200, Layout(16), batch=8, context=131072)
    assert long.time.state_ms > short.time.state_ms and long.resident["cache"] > short.resident["cache"]
    huge = predict(k3, h200, Layout(16), batch=256, context=131072)
    assert not huge.fits and "attention cache" in huge.why_not()


def test_k2_thinking_is_priced_with_int4_experts_and_bf16_elsewhere():
    """Kimi K2 Thinking / K2.5 (``plan/models/kimi-k2-thinking``): compressed-tensors int4 experts in
    groups of 32 with a bf16 scale (4.5 bits a parameter), the rest bf16; counted here from the config's
    own fields, not from the Program."""
    from nonstop.plan.releases import model_ref
    from nonstop.weights.resolve import resolve_model

    cfg = resolve_model(model_ref("kimi-k2-thinking"))[0]
    assert cfg.moe.expert_format == "int4"
    k2t = build_workload(cfg, "kimi-k2-thinking")
    assert k2t.precision == Precision("bf16", "int4", "bf16")
    h = cfg.hf
    d, moe_layers = h["hidden_size"], h["num_hidden_layers"] - h["first_k_dense_replace"]
    expert_params = moe_layers * h["n_routed_experts"] * 3 * d * h["moe_intermediate_size"]
    bf16 = build_workload(cfg, "kimi-k2-thinking", Precision("bf16", "bf16"))
    rest = bf16.total_weight_bytes() - 2 * expert_params
    assert k2t.total_weight_bytes() == pytest.approx(expert_params * (0.5 + 2 / 32) + rest, rel=1e-3)
    assert 590e9 < k2t.total_weight_bytes() < 600e9  # the published checkpoint: ~594 GB
    moe = next(o for o in k2t.ops if o.expert)
    assert moe.dtype == "bf16"  # W4A16: dequantised into bf16 tensor-core GEMMs


def test_int4_experts_are_planned_but_the_engine_refuses_to_build_them():
    from nonstop.config_types import ConfigError
    from nonstop.model.moe import RoutedExperts

    raw = dict(ModelConfig.preset("kimi-k2").hf)
    group = {"weights": {"num_bits": 4, "type": "int", "group_size": 32, "strategy": "group"}}
    raw["quantization_config"] = {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}}
    assert ModelConfig.from_hf_dict(raw).moe.expert_format == "int4"
    group["weights"]["num_bits"] = 8
    with pytest.raises(ConfigError, match="unsupported quantization_config"):
        ModelConfig.from_hf_dict(raw)
    with pytest.raises(ConfigError, match="nonstop plan"):
        RoutedExperts(3, 8, 5, "int4")
