"""Router (grouped top-k, bias for selection only, renormalise, scaling) and RoPE inverse frequencies
against transformers' implementations."""

from __future__ import annotations

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.moe import route
from nonstop.model.rope import apply_rope, rope_inv_freq
from tests.tiny_configs import DEEPSEEK, LLAMA


def test_grouped_router_matches_explicit_selection():
    cfg = ModelConfig.from_hf_dict(DEEPSEEK).moe  # 8 experts, 4 groups, keep 2 groups, top-3
    x, w = torch.randn(20, 36), torch.randn(8, 36)
    bias = torch.randn(8) * 0.3
    weights, ids = route(x, w, bias, cfg)
    s = torch.sigmoid(x @ w.t())
    for n in range(20):
        choice = s[n] + bias
        group_score = [
            sorted(choice[g * 2 : g * 2 + 2].tolist())[-1] + sorted(choice[g * 2 : g * 2 + 2].tolist())[-2]
            for g in range(4)
        ]
        groups = sorted(range(4), key=lambda g: -group_score[g])[:2]
        allowed = [e for e in range(8) if e // 2 in groups]
        chosen = sorted(allowed, key=lambda e: -choice[e].item())[:3]
        assert sorted(ids[n].tolist()) == sorted(chosen)
        expected = {e: (s[n, e] / sum(s[n, c] for c in chosen) * cfg.routed_scaling_factor).item() for e in chosen}
        for e, wt in zip(ids[n].tolist(), weights[n].tolist()):
            assert wt == pytest.approx(expected[e], rel=1e-5)


@pytest.mark.parametrize("raw", [LLAMA, DEEPSEEK], ids=["llama3", "yarn"])
def test_inv_freq_matches_transformers(raw):
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = ModelConfig.from_hf_dict(raw)
    args = {k: v for k, v in raw.items() if k != "model_type"}
    hf_cfg = transformers.AutoConfig.for_model(raw["model_type"], **args)
    kind = hf_cfg.rope_parameters["rope_type"]
    inv, mag = ROPE_INIT_FUNCTIONS[kind](hf_cfg, "cpu")
    ours, our_mag = rope_inv_freq(cfg.rope)
    torch.testing.assert_close(ours, inv.float(), rtol=1e-6, atol=0)
    assert our_mag == pytest.approx(mag)


def test_interleaved_rope_equals_deinterleaved_neox():
    """GPT-J pairs (2i, 2i+1) rotated in place equal NeoX halves after de-interleaving."""
    x = torch.randn(3, 4, 8)
    angles = torch.randn(3, 1, 4)
    cos, sin = angles.cos(), angles.sin()
    inter = apply_rope(x, cos, sin, interleaved=True)
    perm = torch.cat([torch.arange(0, 8, 2), torch.arange(1, 8, 2)])
    neox = apply_rope(x[..., perm], cos, sin, interleaved=False)
    torch.testing.assert_close(inter[..., perm], neox)
