"""Model building blocks where the existing tests cannot see a change: low-precision dtypes and rounding of the
rotation and RMSNorm, non-unit gated-norm weights, and SiTU caps that small random activations never reach."""

from __future__ import annotations

import math

import torch

from nonstop.model.norms import rms_norm
from nonstop.model.rope import apply_rope


def _hand_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    a, b = x[..., :half].float(), x[..., half:].float()
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def test_apply_rope_returns_the_input_dtype():
    """A rotation that returns its fp32 working copy would turn a bf16 model's queries and keys into fp32."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, generator=gen).to(torch.bfloat16)
    angles = torch.randn(2, 1, 4, generator=gen)
    cos, sin = angles.cos(), angles.sin()
    for interleaved in (False, True):
        out = apply_rope(x, cos, sin, interleaved)
        assert out.dtype == torch.bfloat16
    out = apply_rope(x, cos, sin, interleaved=False)
    torch.testing.assert_close(out, _hand_neox(x, cos, sin).to(torch.bfloat16), rtol=0, atol=0)


def test_rms_norm_rounds_before_the_weight_as_transformers():
    """Llama/Kimi RMSNorm casts the normalised x back to the input dtype and then multiplies by the weight
    (transformers' LlamaRMSNorm); multiplying in fp32 and rounding once differs in bf16, and with an fp32
    weight the result dtype is fp32 (promotion), not the input's."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(4, 64, generator=gen) * 3).to(torch.bfloat16)
    weight = torch.rand(64, generator=gen) * 2 + 0.1
    hf = LlamaRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        hf.weight.copy_(weight)
    expected = hf(x)  # fp32 weight ⊙ bf16 normed -> fp32
    ours = rms_norm(x, weight, 1e-5)
    assert ours.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(ours, expected, rtol=0, atol=0)
    hf_bf16 = hf.to(torch.bfloat16)
    torch.testing.assert_close(rms_norm(x, weight.to(torch.bfloat16), 1e-5), hf_bf16(x), rtol=0, atol=0)


def test_gated_rms_norm_applies_weight_and_sigmoid_gate():
    """KDA's output norm y = w ⊙ x / sqrt(mean(x²) + eps) ⊙ σ(gate) (FLA FusedRMSNormGated, sigmoid): random
    models hold unit weights, so dropping the weight goes unseen elsewhere. Checked by explicit loops."""
    from nonstop.model.norms import GatedRMSNorm, gated_rms_norm

    gen = torch.Generator().manual_seed(2)
    x, gate = torch.randn(3, 6, generator=gen), torch.randn(3, 6, generator=gen)
    weight = torch.rand(6, generator=gen) * 2 - 0.5
    eps = 0.25  # large, so that its place inside the root shows
    expected = torch.empty(3, 6)
    for r in range(3):
        ms = sum(v * v for v in x[r].tolist()) / 6
        for c in range(6):
            sig = 1 / (1 + torch.exp(-gate[r, c]).item())
            expected[r, c] = weight[c].item() * x[r, c].item() / (ms + eps) ** 0.5 * sig
    torch.testing.assert_close(gated_rms_norm(x, gate, weight, eps), expected, rtol=1e-5, atol=1e-6)
    module = GatedRMSNorm(6, eps)
    with torch.no_grad():
        module.weight.copy_(weight)
    torch.testing.assert_close(module(x, gate), expected, rtol=1e-5, atol=1e-6)


def _situ(g: float, u: float, beta: float, linear_beta: float) -> float:
    sig = 1 / (1 + math.exp(-g))
    return beta * math.tanh(g / beta) * sig * linear_beta * math.tanh(u / linear_beta)


def test_situ_mlp_caps_gate_with_beta_and_up_with_linear_beta():
    """SiTU-GLU caps the gate at β1 and the up projection at β2 (K3: 4 and 25); with activations far beyond
    both caps, swapping them (in ``gated_mlp`` or ``GatedMLP``) changes the output. Hand computed per channel."""
    from nonstop.model.mlp import GatedMLP, gated_mlp

    x = torch.tensor([[30.0, -12.0], [7.0, 40.0]])
    w_gate = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.0, -1.0]])
    w_up = torch.tensor([[0.0, 2.0], [1.0, 0.0], [1.5, 1.0]])
    w_down = torch.tensor([[1.0, 0.25, -0.5], [0.0, 1.0, 2.0]])
    beta, linear_beta = 3.0, 11.0
    expected = torch.empty(2, 2)
    for r in range(2):
        g = [sum(w_gate[i, j].item() * x[r, j].item() for j in range(2)) for i in range(3)]
        u = [sum(w_up[i, j].item() * x[r, j].item() for j in range(2)) for i in range(3)]
        h = [_situ(g[i], u[i], beta, linear_beta) for i in range(3)]
        for o in range(2):
            expected[r, o] = sum(w_down[o, i].item() * h[i] for i in range(3))
    out = gated_mlp(x, w_gate, w_up, w_down, "situ", beta, linear_beta)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)
    module = GatedMLP(2, 3, "situ", beta, linear_beta)
    with torch.no_grad():
        module.gate_proj.weight.copy_(w_gate)
        module.up_proj.weight.copy_(w_up)
        module.down_proj.weight.copy_(w_down)
    torch.testing.assert_close(module(x), expected, rtol=1e-5, atol=1e-4)


def test_gated_mlp_module_biases_match_transformers_llama_mlp():
    """``GatedMLP(bias=True)`` hands each projection's bias to its own projection (Llama ``mlp_bias``);
    swapped gate / up biases differ from transformers' LlamaMLP."""
    import transformers
    from transformers.models.llama.modeling_llama import LlamaMLP

    from nonstop.model.mlp import GatedMLP

    hf_cfg = transformers.LlamaConfig(
        hidden_size=4, intermediate_size=6, mlp_bias=True, hidden_act="silu", num_attention_heads=1
    )
    hf = LlamaMLP(hf_cfg)
    gen = torch.Generator().manual_seed(3)
    ours = GatedMLP(4, 6, "silu", bias=True)
    with torch.no_grad():
        for name in ("gate_proj", "up_proj", "down_proj"):
            for part in ("weight", "bias"):
                value = torch.randn(getattr(getattr(hf, name), part).shape, generator=gen)
                getattr(getattr(hf, name), part).copy_(value)
                getattr(getattr(ours, name), part).copy_(value)
        x = torch.randn(3, 4, generator=gen)
        torch.testing.assert_close(ours(x), hf(x), rtol=1e-5, atol=1e-6)


def test_by_rows_computes_every_row_alone_and_restores_the_shape():
    """``by_rows`` (the row-exact router logits and elementwise ops) must call fn on each of the R rows as
    [1, n] and stack all R results back to [..., m]; a loop that stops one row short loses the last row."""
    from nonstop.model.rows import by_rows

    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 5, generator=gen)
    w = torch.randn(4, 5, generator=gen)
    seen = []

    def fn(row, weight):
        seen.append(tuple(row.shape))
        return row @ weight.t()

    out = by_rows(fn, x, w)
    assert seen == [(1, 5)] * 6
    assert out.shape == (2, 3, 4)
    for b in range(2):
        for t in range(3):
            for o in range(4):
                want = sum(x[b, t, i].item() * w[o, i].item() for i in range(5))
                assert abs(out[b, t, o].item() - want) < 1e-5


def test_row_exact_is_switched_off_again_after_the_block():
    """``row_exact()`` must restore the flag on exit (also on an exception): a leaked flag would run every
    later step of the thread row by row (slow, and the CPU executor's compiled steps assume it is off)."""
    import pytest

    from nonstop.model.rows import is_row_exact, row_exact

    assert not is_row_exact()
    with row_exact():
        assert is_row_exact()
    assert not is_row_exact()
    with pytest.raises(RuntimeError), row_exact():
        raise RuntimeError
    assert not is_row_exact()
