"""Reference-model math that the family oracle tests leave unpinned (their tiny configs hit only one side of
a branch): GQA head grouping with several KV heads, the attention-residual query's norm weight, RoPE
scaling variants and the YaRN magnitude against transformers, softmax router scoring, norm_topk_prob=False,
gated-MLP biases and the row-exact linear's bias."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nonstop.config import ModelConfig
from nonstop.model.attention import gqa_attention
from nonstop.model.build import random_model
from nonstop.model.linear import linear
from nonstop.model.mlp import gated_mlp
from nonstop.model.moe import route
from nonstop.model.rope import Rotary
from nonstop.model.rows import row_exact
from tests.model.test_k3_parts import _k3_forward_vllm_bookkeeping
from tests.tiny_configs import DEEPSEEK, KIMI_K3, LLAMA


def test_gqa_query_head_h_reads_kv_head_h_div_group():
    """transformers' repeat_kv: query heads [g·r, (g+1)·r) share KV head g (r = H / Hkv)."""
    gen = torch.Generator().manual_seed(0)
    B, T, S, H, Hkv, D, Dv = 2, 3, 5, 6, 2, 4, 3
    q = torch.randn(B, T, H, D, generator=gen)
    k = torch.randn(B, S, Hkv, D, generator=gen)
    v = torch.randn(B, S, Hkv, Dv, generator=gen)
    mask = torch.rand(B, T, S, generator=gen) > 0.3
    mask[..., 0] = True
    scale = 0.37
    out = gqa_attention(q, k, v, mask, scale)
    expected = torch.empty(B, T, H, Dv)
    for b in range(B):
        for t in range(T):
            for h in range(H):
                g = h // (H // Hkv)
                s = (k[b, :, g] @ q[b, t, h]) * scale
                s = s.masked_fill(~mask[b, t], float("-inf"))
                expected[b, t, h] = torch.softmax(s, 0) @ v[b, :, g]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_attention_residual_query_scales_by_the_res_norm_weight():
    """w = γ ⊙ p: a checkpoint's non-unit ``*_res_norm.weight`` changes the depth mix (random models hold ones)."""
    cfg = ModelConfig.from_hf_dict(KIMI_K3)
    model = random_model(cfg, torch.float32, seed=11)
    gen = torch.Generator().manual_seed(5)
    for name, p in model.named_parameters():
        if name.endswith("res_norm.weight"):
            p.copy_(torch.rand(p.shape, generator=gen) * 3 - 1)
    ids = torch.randint(0, cfg.vocab_size, (1, 5), generator=gen)
    torch.testing.assert_close(model(ids), _k3_forward_vllm_bookkeeping(model, ids), rtol=1e-5, atol=1e-5)


ROPE_VARIANTS = {
    # llama 3.1's own numbers: wavelengths fall in the smoothed band between high and low
    "llama3-medium-band": {
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "linear": {"rope_theta": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    # no mscale fields: the magnitude is 0.1·ln(factor) + 1
    "yarn-default-magnitude": {
        "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    },
    # mscale != mscale_all_dim: magnitude is their ratio
    "yarn-mscale-ratio": {
        "rope_theta": 10000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 256,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
        },
    },
    "yarn-attention-factor": {
        "rope_theta": 10000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 256,
            "attention_factor": 0.8,
        },
    },
    # small theta: the upper correction dim (ceil 36 at rotary dim 32) is clamped at dim - 1
    "yarn-high-clamp": {
        "rope_theta": 10.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    },
    "yarn-no-truncate": {
        "rope_theta": 10000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 300,
            "truncate": False,
        },
    },
}


@pytest.mark.parametrize("variant", list(ROPE_VARIANTS))
def test_rope_cos_sin_match_transformers(variant):
    """Our cos/sin (inverse frequencies × positions, times the magnitude) equal transformers' rotary embedding."""
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    raw = {**LLAMA, "head_dim": 32, "max_position_embeddings": 16384, **ROPE_VARIANTS[variant]}
    cfg = ModelConfig.from_hf_dict(raw)
    hf_cfg = transformers.AutoConfig.for_model("llama", **{k: v for k, v in raw.items() if k != "model_type"})
    positions = torch.tensor([[0, 1, 7, 100, 3000, 12000]])
    hf_cos, hf_sin = LlamaRotaryEmbedding(hf_cfg)(torch.zeros(1, dtype=torch.float32), positions)
    cos, sin = Rotary(cfg.rope).cos_sin(positions)
    half = cfg.rope.dim // 2
    torch.testing.assert_close(cos, hf_cos[..., :half].float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sin, hf_sin[..., :half].float(), rtol=1e-5, atol=1e-5)


def _explicit_route(x, w, bias, k, scoring, renorm, scale):
    logits = x @ w.t()
    s = torch.softmax(logits, -1) if scoring == "softmax" else torch.sigmoid(logits)
    out = []
    for n in range(x.shape[0]):
        chosen = sorted(range(w.shape[0]), key=lambda e: -(s[n, e] + bias[e]).item())[:k]
        total = sum(s[n, c].item() for c in chosen) if renorm else 1.0
        out.append({e: s[n, e].item() / total * scale for e in chosen})
    return out


@pytest.mark.parametrize("scoring,renorm", [("softmax", True), ("sigmoid", False), ("softmax", False)])
def test_router_scoring_and_renormalisation(scoring, renorm):
    """scoring_func softmax normalises over all experts before top-k; norm_topk_prob=False keeps raw scores."""
    raw = {**DEEPSEEK, "n_group": 1, "topk_group": 1, "scoring_func": scoring, "norm_topk_prob": renorm}
    cfg = ModelConfig.from_hf_dict(raw).moe
    assert (cfg.scoring, cfg.renormalize) == (scoring, renorm)
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(6, 36, generator=gen), torch.randn(8, 36, generator=gen)
    bias = torch.randn(8, generator=gen) * 0.01
    weights, ids = route(x, w, bias, cfg)
    expected = _explicit_route(x, w, bias, cfg.top_k, scoring, renorm, cfg.routed_scaling_factor)
    for n in range(6):
        assert sorted(ids[n].tolist()) == sorted(expected[n])
        for e, wt in zip(ids[n].tolist(), weights[n].tolist()):
            assert wt == pytest.approx(expected[n][e], rel=1e-5)


def test_gated_mlp_applies_each_bias_to_its_projection():
    gen = torch.Generator().manual_seed(2)
    D, I = 5, 7
    x = torch.randn(3, D, generator=gen)
    wg, wu, wd = torch.randn(I, D, generator=gen), torch.randn(I, D, generator=gen), torch.randn(D, I, generator=gen)
    bg, bu, bd = torch.randn(I, generator=gen), torch.randn(I, generator=gen), torch.randn(D, generator=gen)
    out = gated_mlp(x, wg, wu, wd, "silu", biases=(bg, bu, bd))
    g, u = x @ wg.t() + bg, x @ wu.t() + bu
    expected = (g * torch.sigmoid(g) * u) @ wd.t() + bd
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_row_exact_linear_keeps_the_bias():
    """Speculative verification (row-exact mode) of a checkpoint with attention_bias adds the bias too."""
    gen = torch.Generator().manual_seed(4)
    x, w, b = torch.randn(2, 3, 6, generator=gen), torch.randn(4, 6, generator=gen), torch.randn(4, generator=gen)
    with row_exact():
        y = linear(x, w, b)
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_kda_sequence_starting_at_zero_ignores_what_the_slot_held():
    """StepBatch start == 0 is a new sequence: KDA's conv window and recurrent state start from zeros even
    when the slot still holds an earlier sequence's state (the layer's contract, not only cache.reset's)."""
    from nonstop.cache.state import ModelCache
    from tests.tiny_configs import KIMI_LINEAR_RELEASE

    cfg = ModelConfig.from_hf_dict(KIMI_LINEAR_RELEASE)
    model = random_model(cfg, torch.float32, seed=8)
    gen = torch.Generator().manual_seed(9)
    a, b = (torch.randint(0, cfg.vocab_size, (1, 6), generator=gen) for _ in range(2))
    clean = ModelCache(cfg, num_slots=1, capacity=16)
    expected = model(b, clean, clean.batch([0], 6))
    used = ModelCache(cfg, num_slots=1, capacity=16)
    first = used.batch([0], 6)
    model(a, used, first)
    used.advance(first)
    used.lengths[0] = 0  # the slot's KDA state still holds sequence a
    torch.testing.assert_close(model(b, used, used.batch([0], 6)), expected, rtol=1e-5, atol=1e-5)
