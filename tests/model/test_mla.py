"""MLA: the weight-absorbed decode form equals the naive expanded form (NoPE, RoPE, gated, q-LoRA)."""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.model.mla import mla_attend_absorbed, mla_attend_naive
from tests.tiny_configs import DEEPSEEK, KIMI_K3, KIMI_LINEAR_RELEASE


@pytest.mark.parametrize("raw", [DEEPSEEK, KIMI_LINEAR_RELEASE, KIMI_K3], ids=["rope+qlora", "nope", "gated"])
def test_absorbed_equals_naive_in_attention(raw):
    cfg = ModelConfig.from_hf_dict(raw).mla
    g = torch.Generator().manual_seed(1)
    B, T, S = 2, 3, 11
    q_nope = torch.randn(B, T, cfg.num_heads, cfg.qk_nope_head_dim, generator=g)
    q_pe = torch.randn(B, T, cfg.num_heads, cfg.qk_rope_head_dim, generator=g)
    latent = torch.randn(B, S, cfg.kv_lora_rank, generator=g)
    k_pe = torch.randn(B, S, cfg.qk_rope_head_dim, generator=g)
    kv_b = torch.randn(cfg.num_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank, generator=g)
    mask = torch.rand(B, T, S, generator=g) > 0.3
    mask[..., 0] = True
    a = mla_attend_naive(q_nope, q_pe, latent, k_pe, kv_b, mask, cfg)
    b = mla_attend_absorbed(q_nope, q_pe, latent, k_pe, kv_b, mask, cfg)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("raw", [DEEPSEEK, KIMI_K3], ids=["deepseek", "k3"])
def test_absorbed_and_naive_decode_agree_in_the_model(raw):
    cfg = ModelConfig.from_hf_dict(raw)
    model = random_model(cfg, torch.float32, seed=2)
    ids = torch.randint(0, cfg.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    outs = {}
    for absorbed in (True, False):
        for layer in model.layers:
            if layer.attn_type == "mla":
                layer.self_attn.absorbed = absorbed
        cache = ModelCache(cfg, 1)
        steps = []
        for t in range(ids.shape[1]):
            batch = cache.batch([0], 1)
            steps.append(model(ids[:, t : t + 1], cache, batch)[0, 0])
            cache.advance(batch)
        outs[absorbed] = torch.stack(steps)
    torch.testing.assert_close(outs[True], outs[False], rtol=1e-4, atol=1e-5)
