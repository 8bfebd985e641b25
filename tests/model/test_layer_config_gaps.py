"""Config-dependent branches of the reference layers that the tiny family configs do not reach: the YaRN
correction range clamped at dim - 1 (against transformers), SiTU's soft caps taken from the config
(activation_situ_beta / activation_situ_linear_beta, written out as the K3 equation), and RMSNorm's
rounding order in bf16 (bit-equal to transformers' LlamaRMSNorm)."""

from __future__ import annotations

import math

import torch

from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.model.norms import rms_norm
from nonstop.model.rope import Rotary
from tests.tiny_configs import KIMI_K3, LLAMA


def test_yarn_upper_correction_dim_is_clamped_at_dim_minus_one():
    """A small theta and a long original context put the beta_slow correction dim past the rotary dim: the
    ramp's upper end is dim - 1 (transformers' find_correction_range), which moves the blended frequencies."""
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    raw = {
        **LLAMA,
        "head_dim": 32,
        "max_position_embeddings": 8192,
        "rope_theta": 10.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    }
    # the case this test is for: the upper correction dim lies past dim - 1 while the lower one is below dim / 2
    dim = 32
    high = math.ceil(dim * math.log(1024 / (1 * 2 * math.pi)) / (2 * math.log(10.0)))
    low = math.floor(dim * math.log(1024 / (32 * 2 * math.pi)) / (2 * math.log(10.0)))
    assert high > dim - 1 and low < dim // 2 - 1
    cfg = ModelConfig.from_hf_dict(raw)
    hf_cfg = transformers.AutoConfig.for_model("llama", **{k: v for k, v in raw.items() if k != "model_type"})
    positions = torch.tensor([[0, 1, 5, 300, 4000]])
    hf_cos, hf_sin = LlamaRotaryEmbedding(hf_cfg)(torch.zeros(1, dtype=torch.float32), positions)
    cos, sin = Rotary(cfg.rope).cos_sin(positions)
    torch.testing.assert_close(cos, hf_cos[..., : dim // 2].float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sin, hf_sin[..., : dim // 2].float(), rtol=1e-5, atol=1e-5)


def test_situ_soft_caps_come_from_the_config():
    """A K3 checkpoint with its own activation_situ_beta / activation_situ_linear_beta: the dense MLP computes
    W_down [β1·tanh(g/β1)·σ(g) ⊙ β2·tanh(u/β2)] with those β, not K3's defaults 4 and 25."""
    b1, b2 = 1.5, 3.0
    raw = {
        **KIMI_K3,
        "text_config": {**KIMI_K3["text_config"], "activation_situ_beta": b1, "activation_situ_linear_beta": b2},
    }
    cfg = ModelConfig.from_hf_dict(raw)
    assert (cfg.situ_beta, cfg.situ_linear_beta) == (b1, b2)
    model = random_model(cfg, torch.float32, seed=3)
    mlp = model.layers[0].mlp  # first_k_dense_replace = 1: layer 0 is dense
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, cfg.hidden_size, generator=gen)
    with torch.no_grad():
        for p in (mlp.gate_proj.weight, mlp.up_proj.weight):  # pre-activations of several units, where the caps bite
            p.copy_(torch.randn(p.shape, generator=gen))
        out = mlp(x)
    g, u = x @ mlp.gate_proj.weight.t(), x @ mlp.up_proj.weight.t()
    h = (b1 * torch.tanh(g / b1) * torch.sigmoid(g)) * (b2 * torch.tanh(u / b2))
    torch.testing.assert_close(out, h @ mlp.down_proj.weight.t(), rtol=1e-5, atol=1e-6)


def test_rms_norm_in_bf16_rounds_like_transformers():
    """y = w ⊙ round_bf16(x / rms(x)): the normalised value is cast back before the weight (LlamaRMSNorm,
    KimiLinearRMSNorm), bit for bit in bf16."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    gen = torch.Generator().manual_seed(0)
    d = 96
    x = (torch.randn(64, d, generator=gen) * 3).to(torch.bfloat16)
    ref = LlamaRMSNorm(d, eps=1e-5).to(torch.bfloat16)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(d, generator=gen).to(torch.bfloat16))
        want = ref(x)
    got = rms_norm(x, ref.weight.detach(), 1e-5)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want)
