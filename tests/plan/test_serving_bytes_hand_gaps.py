"""The planner's weight bytes in each serving format against a hand count from the published shapes
(/work/shared/reference/kimi-k3.md 7, 10; model-architecture.md 6, 7) and the formats' block scales:

  fp8    1 byte + one fp32 scale per 128 x 128 block    = 1 + 4/16384 bytes a value (DeepSeek-V3, Kimi K2)
  mxfp4  4 bits + one E8M0 byte per 32 values           = 0.5 + 1/32 (Kimi K3 routed experts)
  nvfp4  4 bits + one fp8 byte per 16 values            = 0.5 + 1/16
  int4   4 bits + one bf16 scale per 32 values          = 0.5 + 2/32 (Kimi K2 Thinking / K2.5 experts)

the embedding and LM head in bf16 beside a quantised format, vectors (norms, conv taps) as stored, the router
matrix in bf16 (as served), its correction bias and KDA's A_log / dt_bias in fp32.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import nonstop
from nonstop.config import ModelConfig
from nonstop.plan.chips import get_chip
from nonstop.plan.layout import Layout
from nonstop.plan.predict import predict
from nonstop.plan.workload import Precision, build_workload

MODELS_DIR = Path(nonstop.__file__).parent / "plan" / "models"
FMT = {
    "bf16": 2.0,
    "fp8": 1 + 4 / 128**2,
    "mxfp4": 0.5 + 1 / 32,
    "nvfp4": 0.5 + 1 / 16,
    "int4": 0.5 + 2 / 32,
}

D, V = 7168, 163840
# Kimi K2 / K2 Thinking: 61 MLA layers (64 heads), layer 0 dense (18432), 60 MoE layers of 384 experts (2048)
K2_MLA = 1536 * D + 64 * 192 * 1536 + 576 * D + 64 * 256 * 512 + D * 64 * 128  # matrices of one layer
K2_MLA_VEC = 1536 + 512  # q_a_layernorm, kv_a_layernorm
K2_EXPERT = 3 * D * 2048
K2_SHARED = 3 * D * 2048
K2_DENSE = 3 * D * 18432
K2_ROUTER = 384 * D


def _k2_bytes(dense: str, experts: str, top_k: int | None) -> float:
    """Kimi K2's held bytes (top_k None) or bytes one token reads at batch 1 (top_k experts a layer; the
    embedding is a row gather, not counted)."""
    mats = 61 * K2_MLA + K2_DENSE + 60 * K2_SHARED
    vectors = 61 * (2 * D + K2_MLA_VEC) + D  # norms
    head = V * D * (FMT["bf16"] if dense != "bf16" else 2)
    n_experts = 384 if top_k is None else top_k
    out = mats * FMT[dense] + vectors * 2 + 60 * (K2_ROUTER * 2 + 384 * 4) + 60 * n_experts * K2_EXPERT * FMT[experts]
    return out + head * (2 if top_k is None else 1)  # embedding + LM head held; only the head streamed


@pytest.mark.parametrize(
    "where, precision",
    [
        ("kimi-k2-thinking", None),  # the release: int4 experts, bf16 rest
        ("kimi-k2-thinking", Precision("fp8", "fp8", "bf16")),
        ("kimi-k2-thinking", Precision("bf16", "mxfp4", "bf16")),
        ("kimi-k2-thinking", Precision("nvfp4", "nvfp4", "bf16")),
    ],
)
def test_k2_bytes_in_each_serving_format(where, precision):
    """Held and batch-1 streamed bytes of Kimi K2 Thinking in each format, to 1e-5 (the rope frequency table
    streamed beside them is a few KB): catches a format's scale bytes left out or doubled, the embedding / head
    quantised with the rest, the router priced in its fp32 load dtype, or all experts streamed."""
    cfg = ModelConfig.from_file(MODELS_DIR / where)
    w = build_workload(cfg, where, precision)
    dense, experts = (precision.dense, precision.experts) if precision else ("bf16", "int4")
    assert w.precision.dense == dense and w.precision.experts == experts
    assert w.total_weight_bytes() == pytest.approx(_k2_bytes(dense, experts, None), rel=1e-5)
    assert w.active_weight_bytes() == pytest.approx(_k2_bytes(dense, experts, 8), rel=1e-5)


def test_k2_thinking_checkpoint_is_594_gb():
    """The published Kimi K2 Thinking checkpoint is ~594 GB (int4 experts with bf16 scales per 32, the rest
    bf16); the hand count above gives the same."""
    assert _k2_bytes("bf16", "int4", None) == pytest.approx(594e9, rel=0.01)


def test_k3_release_bytes_are_the_hand_count():
    """Kimi K3 as released (MXFP4 routed experts, everything else bf16, router served in bf16): held bytes =
    kimi-k3.md 7's 1.56 TB checkpoint, streamed per token ~137 GB (kimi-k3.md 10), each to 1e-5 of the count
    from its shapes."""
    w = build_workload(ModelConfig.preset("kimi-k3"), "kimi-k3")
    kda = 4 * 12288 * D + 128 * D + 12288 * 128 + 96 * D + D * 12288  # q k v g, f_a, f_b, b, o
    kda_small = 3 * 12288 * 4 * 2 + 128 * 2 + (12288 + 96) * 4  # conv taps, o_norm (bf16); dt_bias, A_log (fp32)
    mla = 1536 * D + 96 * 192 * 1536 + 576 * D + 96 * 256 * 512 + D * 12288 + 12288 * D
    moe = 896 * D * 2 + 896 * 4 + 2 * 3584 * D * 2 + 3584 * 2 + 3 * 6144 * D * 2  # router, latent, shared
    expert = 3 * 3072 * 3584 * FMT["mxfp4"]
    vectors = (93 * 6 * D + 3 * D + 24 * (1536 + 512)) * 2  # norms + AttnRes vectors; MLA low-rank norms
    common = 69 * (kda * 2 + kda_small) + 24 * mla * 2 + 3 * D * 33792 * 2 + 92 * moe + vectors + V * D * 2
    held, streamed = common + V * D * 2 + 92 * 896 * expert, common + 92 * 16 * expert
    assert w.total_weight_bytes() == pytest.approx(held, rel=1e-5)
    # streamed: the engine folds each AttnRes norm x projection pair into one vector (187 x 7168 x 2 B less)
    assert w.active_weight_bytes() == pytest.approx(streamed - 187 * D * 2, rel=1e-6)
    assert held == pytest.approx(1_560_860_324_864, rel=1e-3)
    assert streamed == pytest.approx(137e9, rel=0.005)


def test_deepseek_v3_fp8_release_bytes():
    """DeepSeek-V3 from its published config (fp8, 128 x 128 blocks): 671.0B parameters held at 1 + 4/16384
    bytes (the embedding and the LM head at 2), the MTP layer not held."""
    w = build_workload(ModelConfig.from_file(MODELS_DIR / "deepseek-v3"), "deepseek-v3")
    assert w.precision.dense == "fp8" and w.precision.experts == "fp8"
    mla = 1536 * D + 128 * 192 * 1536 + 576 * D + 128 * 256 * 512 + D * 128 * 128
    mats = 61 * mla + 3 * 3 * D * 18432 + 58 * (3 * D * 2048 + 256 * 3 * D * 2048)
    vectors = (61 * (2 * D + 1536 + 512) + D) * 2
    held = mats * FMT["fp8"] + vectors + 58 * (256 * D * 2 + 256 * 4) + 2 * 129280 * D * 2
    assert w.total_weight_bytes() == pytest.approx(held, rel=1e-5)


def test_deepseek_v3_cache_per_token_and_resident_cache():
    """Gap: the planner's cache per token is 61 x 576 x 2 bytes, and a rank's resident cache at --context C
    for B sequences under TP8 is B x C of it (the latent is replicated, not split over heads)."""
    dsv3 = build_workload(ModelConfig.from_file(MODELS_DIR / "deepseek-v3"), "deepseek-v3")
    assert dsv3.cache_bytes_per_token() == (61 * 576 * 2)
    p = predict(dsv3, get_chip("h200"), Layout(8), batch=8, context=51_000)
    assert p.resident["cache"] == 8 * 51_000 * (61 * 576 * 2)
