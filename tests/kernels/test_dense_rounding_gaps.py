"""Dense kernels (``nonstop/kernels/dense.py``) on two points the twin-checks leave loose: the MLP rounds the
gate projection to the model dtype before the activation (the twin's ``F.linear`` returns a model-dtype
tensor), and ``linear_residual`` without an ``accumulate`` attribute stores (the twin's default).

The MLP check is exact: inputs are chosen so every fp32 dot product is exact, the down projection is the
identity (y = h exactly), and the reference is hand-written: g = (x·w_g) rounded to bf16, h = bf16(bf16(silu(g))
· u) with silu in float64.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from nonstop.kernels import dense

BF16 = torch.bfloat16


def test_mlp_rounds_the_gate_to_the_model_dtype_before_silu():
    """Gates 2^e · (1 + k·2^-9), k = 1..3, are exact in fp32 but not in bf16 (8 significant bits): bf16
    rounds them first, and for several of them silu of the rounded and of the unrounded gate fall on
    different bf16 values - a kernel that skips the rounding returns those."""
    I = D = 16
    ks = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
    es = [0, 0, 0, 1, 1, 1, 2, 2, 2, -1, -1, -1, 3, 3, 3, 1]
    x = torch.zeros(1, D)
    x[0, 0], x[0, 1] = 1.0, 2.0**-9
    wg = torch.zeros(I, D)
    for n, (k, e) in enumerate(zip(ks, es)):
        wg[n, 0], wg[n, 1] = 2.0**e, k * 2.0**e  # g_n = 2^e + k·2^e·2^-9 exactly (two exact products)
    wu = torch.zeros(I, D)
    wu[:, 0] = 1.0  # u = 1
    wd = torch.eye(D)
    g = torch.tensor([2.0**e * (1 + k * 2.0**-9) for k, e in zip(ks, es)], dtype=torch.float64)
    gr = g.to(BF16).double()
    h = (gr * torch.sigmoid(gr)).to(BF16).double().to(BF16)  # silu(g).to(bf16) · 1, rounded
    unrounded = (g * torch.sigmoid(g)).to(BF16)
    assert (unrounded != h).any(), "the case must tell the two apart"
    out = torch.full((1, D), float("nan"), dtype=BF16)
    op = SimpleNamespace(
        reads=["x"],
        writes=["out"],
        weights={"gate": wg.to(BF16), "up": wu.to(BF16), "down": wd.to(BF16)},
        attrs={"act": "silu", "beta": 4.0, "linear_beta": 25.0},
    )
    dense.mlp(op, SimpleNamespace(buf={"x": x.to(BF16), "out": out}))
    assert out[0].tolist() == h.tolist()


def test_linear_residual_without_accumulate_stores():
    """No ``accumulate`` attribute: out = W a (STORE), not out + W a - a NaN-poisoned out must not leak."""
    gen = torch.Generator().manual_seed(9)
    a, w = torch.randn(2, 21, generator=gen), torch.randn(19, 21, generator=gen)
    out = torch.full((2, 19), float("nan"))
    op = SimpleNamespace(reads=["a"], writes=["out"], weights={"w": w}, attrs={})
    dense.linear_residual(op, SimpleNamespace(buf={"a": a, "out": out}))
    torch.testing.assert_close(out, a @ w.T, rtol=1e-5, atol=1e-4)
