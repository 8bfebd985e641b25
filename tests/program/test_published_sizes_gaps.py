"""``nonstop info``'s numbers (``program.footprint.model_footprint``) for the four published models, against a
parameter / byte count written here from the published shapes alone (the tables of
/work/shared/reference/kimi-k3.md 1, 7 and model-architecture.md 6, 7), and that count against the published
totals (DeepSeek-V3 671B / 37B activated, Kimi K3 2.78T / 104.2B, Kimi K2 ~1T / 32B, Kimi Linear 48B-A3B).

Conventions the engine states (``footprint.py`` docstring, ``model/build.meta_model``): total counts every
parameter once (packed MXFP4 as two values a byte, scales none, MTP layers none); active leaves out the
untied embedding table and the unselected routed experts; the router gate, its correction bias, KDA's A_log
and dt_bias are held in fp32; the KDA conv windows are in the model dtype, the KDA state in fp32.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import nonstop
from nonstop.config import ModelConfig
from nonstop.program.footprint import model_footprint

# ----------------------------------------------------------------------------- the hand count


def _mla(d, heads, q_lora, kv_lora, nope, rope, v, gate):
    n = (q_lora * d + q_lora + heads * (nope + rope) * q_lora) if q_lora else heads * (nope + rope) * d
    n += (kv_lora + rope) * d + kv_lora  # kv_a_proj_with_mqa, kv_a_layernorm
    n += heads * (nope + v) * kv_lora + d * heads * v  # kv_b_proj, o_proj
    return n + (heads * v * d if gate else 0)  # K3's gated MLA: g_proj


def _kda(d, heads, dk, conv, full_gate):
    c = heads * dk
    n = 3 * c * d + 3 * c * conv  # q/k/v proj, q/k/v conv1d [C, 1, K]
    n += dk * d + c * dk + heads * d  # f_a, f_b, b_proj
    n += c + heads + dk + d * c  # dt_bias, A_log (live heads), o_norm, o_proj
    return n + (c * d if full_gate else dk * d + c * dk)  # g_proj, or g_a + g_b


def hand(m):
    """(total, active, embedding, fp32 params, active routed-expert params, expert params) of model ``m``."""
    d, vocab = m["d"], m["vocab"]
    total = vocab * d + (0 if m.get("tied") else vocab * d) + d  # embedding, LM head, final norm
    experts = active_experts = fp32 = 0
    for i in range(m["layers"]):
        total += 2 * d + (4 * d if m.get("attnres") else 0)  # input/post norms; AttnRes norm + proj x2
        if m["attn"](i) == "mla":
            total += _mla(d, m["heads"], m["q_lora"], 512, 128, 64, 128, m.get("gate", False))
        else:
            total += _kda(d, m["kda_heads"], 128, 4, m.get("full_gate", False))
            fp32 += m["kda_heads"] * 128 + m["kda_heads"]  # dt_bias, A_log
        if i < m["first_dense"]:
            total += 3 * d * m["inter"]
            continue
        e, k, width, lat = m["experts"], m["top_k"], m["moe_inter"], m.get("latent")
        total += e * d + e + 3 * d * width * m["shared"]  # router + correction bias, shared experts
        fp32 += e * d + e
        if lat:
            total += 2 * lat * d + lat  # latent down / up projections, latent norm
        experts += e * 3 * (lat or d) * width
        active_experts += k * 3 * (lat or d) * width
    if m.get("attnres"):
        total += 2 * d  # output_attn_res_{norm,proj}
    total += experts
    embedding = vocab * d
    active = total - embedding - experts + active_experts + (embedding if m.get("tied") else 0)
    return total, active, embedding, fp32, active_experts, experts


K3 = dict(
    d=7168,
    vocab=163840,
    layers=93,
    heads=96,
    q_lora=1536,
    gate=True,
    kda_heads=96,
    full_gate=True,
    attn=lambda i: "mla" if (i + 1) % 4 == 0 or i == 92 else "kda",
    first_dense=1,
    inter=33792,
    experts=896,
    top_k=16,
    moe_inter=3072,
    shared=2,
    latent=3584,
    attnres=True,
    mxfp4=True,
)
KIMI_LINEAR = dict(
    d=2304,
    vocab=163840,
    layers=27,
    heads=32,
    q_lora=None,
    kda_heads=32,
    attn=lambda i: "mla" if i + 1 in (4, 8, 12, 16, 20, 24, 27) else "kda",
    first_dense=1,
    inter=9216,
    experts=256,
    top_k=8,
    moe_inter=1024,
    shared=1,
)
K2 = dict(
    d=7168,
    vocab=163840,
    layers=61,
    heads=64,
    q_lora=1536,
    attn=lambda i: "mla",
    first_dense=1,
    inter=18432,
    experts=384,
    top_k=8,
    moe_inter=2048,
    shared=1,
)
DSV3 = dict(
    d=7168,
    vocab=129280,
    layers=61,
    heads=128,
    q_lora=1536,
    attn=lambda i: "mla",
    first_dense=3,
    inter=18432,
    experts=256,
    top_k=8,
    moe_inter=2048,
    shared=1,
)


def _models():
    dsv3 = ModelConfig.from_file(Path(nonstop.__file__).parent / "plan" / "models" / "deepseek-v3")
    return {
        "kimi-k3": (ModelConfig.preset("kimi-k3"), K3),
        "kimi-linear": (ModelConfig.preset("kimi-linear-48b-a3b"), KIMI_LINEAR),
        "kimi-k2": (ModelConfig.preset("kimi-k2"), K2),
        "deepseek-v3": (dsv3, DSV3),
    }


MODELS = ("kimi-k3", "kimi-linear", "kimi-k2", "deepseek-v3")


@pytest.fixture(scope="module")
def footprints():
    return {
        name: (
            m,
            model_footprint(cfg, torch.bfloat16),
            model_footprint(cfg, torch.float32),
        )
        for name, (cfg, m) in _models().items()
    }


# ----------------------------------------------------------------------------- the hand count vs published


@pytest.mark.parametrize(
    "m, total, active, rel_total, rel_active",
    [
        (
            K3,
            2.78e12,
            104.2e9,
            0.005,
            0.005,
        ),  # kimi-k3.md 1 / 10: report table 2.78T / 104.2B
        (
            DSV3,
            671e9,
            37e9,
            0.005,
            0.02,
        ),  # 671B main model (the 14B MTP module apart) / 37B activated
        (
            K2,
            1.03e12,
            32e9,
            0.015,
            0.02,
        ),  # "1T total" (1.04T in the brief, 1.026T by shape) / 32B activated
        (KIMI_LINEAR, 48e9, 3e9, 0.03, 0.04),  # the name: 48B-A3B
    ],
)
def test_the_hand_count_matches_the_published_totals(m, total, active, rel_total, rel_active):
    """The count written in this file reproduces each release's published totals (so the pins below stand on
    it, not on the code): a wrong shape in the hand tables fails here first."""
    t, a, *_ = hand(m)
    assert t == pytest.approx(total, rel=rel_total)
    assert a == pytest.approx(active, rel=rel_active)


# ----------------------------------------------------------------------------- the code vs the hand count


@pytest.mark.parametrize("name", MODELS)
def test_total_active_and_embedding_parameters_are_the_hand_count(footprints, name):
    """Total, active and embedding parameters exactly: catches an expert counted active, a missed layer
    kind, a shared expert at the wrong width, the embedding counted active, MLA's g_proj or the AttnRes
    vectors left out."""
    m, fp, fp32 = footprints[name]
    total, active, embedding, *_ = hand(m)
    assert (fp.total_params, fp.active_params, fp.embedding_params) == (
        total,
        active,
        embedding,
    )
    assert (fp32.total_params, fp32.active_params) == (
        total,
        active,
    )  # the dtype changes bytes, not counts


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("elt", [2, 4])
def test_weight_bytes_are_the_checkpoint_in_the_dtype(footprints, name, elt):
    """Held bytes = params x dtype size, with the fp32 router / bias / A_log / dt_bias at 4 bytes and K3's
    MXFP4 experts at 0.5 + 1/32 bytes a value (E8M0 scale per 32): kimi-k3.md 10's 1.56 TB."""
    m, fp_bf16, fp_fp32 = footprints[name]
    fp = fp_bf16 if elt == 2 else fp_fp32
    total, _, _, fp32, _, experts = hand(m)
    expert_bytes = experts * 17 // 32 if m.get("mxfp4") else experts * elt
    assert fp.weight_bytes == (total - experts - fp32) * elt + 4 * fp32 + expert_bytes
    if name == "kimi-k3" and elt == 2:
        assert fp.weight_bytes == pytest.approx(1.5609e12, rel=1e-3)  # the index's 1,560,860,324,864 B


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("elt", [2, 4])
def test_bytes_per_decoded_token_are_the_active_weights(footprints, name, elt):
    """A batch-1 decode step streams every non-expert weight once, top_k experts per MoE layer, one embedding
    row (not the table) and the LM head; to 1e-4 (the engine streams AttnRes' two vectors folded into one and
    a rope frequency table: a few MB). Catches the whole embedding table counted, all experts counted, or a
    bf16 model priced as fp32."""
    m, fp_bf16, fp_fp32 = footprints[name]
    fp = fp_bf16 if elt == 2 else fp_fp32
    total, _, embedding, fp32, active_experts, experts = hand(m)
    dense = total - embedding - experts - fp32
    expert_bytes = active_experts * 17 // 32 if m.get("mxfp4") else active_experts * elt
    expected = m["d"] * elt + dense * elt + 4 * fp32 + expert_bytes
    assert fp.bytes_per_token == pytest.approx(expected, rel=1e-4)
    if name == "kimi-k3" and elt == 2:  # kimi-k3.md 10: ~137 GB with a bf16 router; +1.2 GB for the fp32 one
        assert fp.bytes_per_token - 2 * 896 * 7168 * 92 == pytest.approx(137e9, rel=0.005)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("elt", [2, 4])
def test_cache_per_token_and_state_per_sequence(footprints, name, elt):
    """MLA latent cache (kv_lora_rank + rope dim) per MLA layer per token in the model dtype; KDA state
    H x D x D fp32 per KDA layer plus three conv windows of K-1 columns in the model dtype: 27.6 KB / 449 MB
    for K3 (kimi-k3.md 10), 8.06 KB / 43.4 MB for Kimi Linear, 70.3 KB for K2 and DeepSeek-V3."""
    m, fp_bf16, fp_fp32 = footprints[name]
    fp = fp_bf16 if elt == 2 else fp_fp32
    layers = [m["attn"](i) for i in range(m["layers"])]
    mla, kda = layers.count("mla"), layers.count("kda")
    assert fp.cache_bytes_per_token == mla * (512 + 64) * elt
    h = m.get("kda_heads", 0)
    assert fp.state_bytes_per_sequence == kda * (h * 128 * 128 * 4 + 3 * h * 128 * (4 - 1) * elt)
