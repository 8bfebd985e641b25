"""The K3-only parts against their equations (shared/reference/kimi-k3.md), written here independently
with scalar loops: SiTU, the bounded KDA gate, attention-residual mixing and the block bookkeeping,
gated MLA, latent MoE (dense and MXFP4 experts), MXFP4 decoding."""

from __future__ import annotations

import math

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.activations import situ_glu
from nonstop.model.attnres import attn_res_mix
from nonstop.model.build import random_model
from nonstop.model.kda import kda_gate_lower_bound
from nonstop.weights import mxfp4
from tests.tiny_configs import KIMI_K3, KIMI_K3_MXFP4


def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_situ_matches_scalar_equation():
    g, u = torch.randn(50) * 8, torch.randn(50) * 40
    out = situ_glu(g, u, 4.0, 25.0)
    for gi, ui, oi in zip(g.tolist(), u.tolist(), out.tolist()):
        expected = 4.0 * math.tanh(gi / 4.0) * _sigmoid(gi) * 25.0 * math.tanh(ui / 25.0)
        assert oi == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert out.abs().max() < 100  # bounded by β1·β2


def test_k3_gate_matches_scalar_equation():
    H, D = 3, 4
    f = torch.randn(2, H, D)
    A_log, dt = torch.randn(H), torch.randn(H * D)
    g = kda_gate_lower_bound(f, A_log, dt, -5.0)
    for n in range(2):
        for h in range(H):
            for i in range(D):
                z = math.exp(A_log[h]) * (f[n, h, i] + dt[h * D + i])
                assert float(g[n, h, i]) == pytest.approx(-5.0 * _sigmoid(float(z)), rel=1e-5)
    # lower_bound * sigmoid(z) lies in [lower_bound, 0]; in float32 the sigmoid saturates to exactly 1 for
    # z above ~17 (and to 0 far below), so the closed interval is what the arithmetic guarantees
    assert (g <= 0).all() and (g >= -5).all()
    assert torch.isfinite(g).all()


def test_attn_res_mix_matches_scalar_equation():
    d = 7
    sources = [torch.randn(2, d) * s for s in (1.0, 3.0, 0.2)]
    w = torch.randn(d)
    out = attn_res_mix(sources, w, 1e-5)
    for n in range(2):
        logits = []
        for v in sources:
            vals = v[n].tolist()
            rms = math.sqrt(sum(x * x for x in vals) / d + 1e-5)
            logits.append(sum(a * b for a, b in zip(w.tolist(), vals)) / rms)
        m = max(logits)
        e = [math.exp(x - m) for x in logits]
        alpha = [x / sum(e) for x in e]
        expected = [sum(alpha[s] * sources[s][n, j].item() for s in range(3)) for j in range(d)]
        assert out[n].tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6)


def _k3_forward_vllm_bookkeeping(model, ids):
    """K3 forward with the block buffer written as vLLM describes it: at layer i a block is written to
    slot i // B when i % B == 0; the pre-attention mix reads ceil(i / B) stored blocks + the running
    prefix, the FFN mix ceil(i / B) + [i % B == 0] blocks + the prefix; the output mix all blocks + prefix."""
    cfg = model.cfg
    B = cfg.attn_res_block_size
    eps = cfg.rms_norm_eps
    stored = [None] * math.ceil(cfg.num_hidden_layers / B)
    prefix = model.embed_tokens(ids)
    from nonstop.cache.state import StepBatch

    batch = StepBatch(torch.arange(ids.shape[0]), torch.zeros(ids.shape[0], dtype=torch.long), ids.shape[1])
    for i, layer in enumerate(model.layers):
        valid = math.ceil(i / B)
        w_attn = layer.self_attention_res_norm.weight * layer.self_attention_res_proj.weight[0]
        src = attn_res_mix(stored[:valid] + [prefix], w_attn, eps)
        write = i % B == 0
        if write:
            stored[i // B] = prefix
        a = layer.self_attn(layer.input_layernorm(src), batch, None)
        prefix = a if write else prefix + a
        w_mlp = layer.mlp_res_norm.weight * layer.mlp_res_proj.weight[0]
        src = attn_res_mix(stored[: valid + int(write)] + [prefix], w_mlp, eps)
        prefix = prefix + layer.mlp(layer.post_attention_layernorm(src))
    w_out = model.output_attn_res_norm.weight * model.output_attn_res_proj.weight[0]
    h = attn_res_mix(stored + [prefix], w_out, eps)
    return model.logits(h)


def test_block_attention_residual_bookkeeping():
    cfg = ModelConfig.from_hf_dict(KIMI_K3)  # 7 layers, blocks of 3: two full blocks and a partial one
    model = random_model(cfg, torch.float32, seed=11)
    ids = torch.randint(0, cfg.vocab_size, (2, 6))
    torch.testing.assert_close(model(ids), _k3_forward_vllm_bookkeeping(model, ids), rtol=1e-5, atol=1e-5)


def test_gated_mla_matches_per_head_loop():
    cfg = ModelConfig.from_hf_dict(KIMI_K3)
    model = random_model(cfg, torch.float32, seed=4)
    attn = next(layer.self_attn for layer in model.layers if layer.attn_type == "mla")
    m = cfg.mla
    x = torch.randn(1, 5, cfg.hidden_size)
    from nonstop.cache.state import StepBatch

    out = attn(x, StepBatch(torch.tensor([0]), torch.tensor([0]), 5), None)
    eps = m.lora_norm_eps

    def rms(v, w):
        return w * v / torch.sqrt((v * v).mean() + eps)

    expected = []
    kvb = attn.kv_b_proj.weight.view(m.num_heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)
    lat, kpe = [], []
    for t in range(5):
        kv = attn.kv_a_proj_with_mqa.weight @ x[0, t]
        lat.append(rms(kv[: m.kv_lora_rank], attn.kv_a_layernorm.weight))
        kpe.append(kv[m.kv_lora_rank :])
    for t in range(5):
        xt = x[0, t]
        q = attn.q_b_proj.weight @ rms(attn.q_a_proj.weight @ xt, attn.q_a_layernorm.weight)
        q = q.view(m.num_heads, m.qk_head_dim)
        heads = []
        for h in range(m.num_heads):
            scores = []
            for s in range(t + 1):  # causal, NoPE: the rope slice is scored but never rotated
                k_nope = kvb[h, : m.qk_nope_head_dim] @ lat[s]
                scores.append(
                    (q[h, : m.qk_nope_head_dim] @ k_nope + q[h, m.qk_nope_head_dim :] @ kpe[s]) * m.qk_head_dim**-0.5
                )
            p = torch.softmax(torch.stack(scores), 0)
            heads.append(sum(p[s] * (kvb[h, m.qk_nope_head_dim :] @ lat[s]) for s in range(t + 1)))
        o = torch.cat(heads) * torch.sigmoid(attn.g_proj.weight @ xt)
        expected.append(attn.o_proj.weight @ o)
    torch.testing.assert_close(out[0], torch.stack(expected), rtol=1e-4, atol=1e-5)


def _decode_mxfp4_scalar(packed, scale, k):
    table = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    rows = []
    for r in range(packed.shape[0]):
        row = []
        for j in range(k):
            byte = int(packed[r, j // 2])
            code = byte & 0xF if j % 2 == 0 else byte >> 4
            val = table[code & 7] * (-1 if code & 8 else 1)
            row.append(val * 2.0 ** (int(scale[r, j // 32]) - 127))
        rows.append(row)
    return torch.tensor(rows)


@pytest.mark.parametrize("k", [64, 37])
def test_mxfp4_decode_matches_bit_layout_and_round_trips(k):
    packed = torch.randint(0, 256, (3, (k + 1) // 2), dtype=torch.uint8)
    scale = torch.randint(110, 130, (3, (k + 31) // 32), dtype=torch.uint8)
    w = mxfp4.dequantize(packed, scale, k)
    torch.testing.assert_close(w, _decode_mxfp4_scalar(packed, scale, k))
    p2, s2 = mxfp4.quantize(w)  # representable values survive quantisation exactly
    torch.testing.assert_close(mxfp4.dequantize(p2, s2, k), w)


@pytest.mark.parametrize("raw", [KIMI_K3, KIMI_K3_MXFP4], ids=["dense", "mxfp4"])
def test_latent_moe_matches_per_token_loop(raw):
    cfg = ModelConfig.from_hf_dict(raw)
    model = random_model(cfg, torch.float32, seed=6)
    moe = model.layers[1].mlp
    mc = cfg.moe
    x = torch.randn(6, cfg.hidden_size)
    out = moe(x)

    def expert_w(name, e):
        if mc.expert_format == "dense":
            return getattr(moe.experts, name)[e]
        n, kk = moe.experts.shapes[name]
        return _decode_mxfp4_scalar(
            getattr(moe.experts, f"{name}_packed")[e], getattr(moe.experts, f"{name}_scale")[e], kk
        )

    def situ_mlp(v, wg, wu, wd):
        g, u = wg @ v, wu @ v
        h = torch.tensor(
            [4 * math.tanh(a / 4) * _sigmoid(a) * 25 * math.tanh(b / 25) for a, b in zip(g.tolist(), u.tolist())]
        )
        return wd @ h

    for n in range(6):
        s = torch.sigmoid(moe.gate.weight @ x[n])
        chosen = sorted(range(mc.num_experts), key=lambda e: -(s[e] + moe.gate.e_score_correction_bias[e]).item())[
            : mc.top_k
        ]
        weights = [s[e] / sum(s[c] for c in chosen) * mc.routed_scaling_factor for e in chosen]
        z = moe.routed_expert_down_proj.weight @ x[n]
        u = sum(
            w * situ_mlp(z, expert_w("w1", e), expert_w("w3", e), expert_w("w2", e)) for w, e in zip(weights, chosen)
        )
        u = moe.routed_expert_norm.weight * u / torch.sqrt((u * u).mean() + cfg.rms_norm_eps)
        sh = moe.shared_experts
        y = moe.routed_expert_up_proj.weight @ u + situ_mlp(
            x[n], sh.gate_proj.weight, sh.up_proj.weight, sh.down_proj.weight
        )
        torch.testing.assert_close(out[n], y, rtol=1e-4, atol=1e-5)
