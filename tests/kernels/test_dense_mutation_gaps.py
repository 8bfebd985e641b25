"""Dense kernels (``nonstop/kernels/dense.py``) on inputs the twin-checks never build: an MLP with biases
(``mlp_bias: true`` checkpoints; no tiny config sets it) and an LM head whose final norm's eps matters.

References are plain torch from the equations (docs: model-architecture: RMSNorm y = w ⊙ x / sqrt(mean x² +
eps), SwiGLU silu(g) ⊙ u), in fp32 at small odd shapes; outputs are poisoned with NaN before each launch.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nonstop.kernels import dense


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("accumulate", [False, True])
def test_mlp_with_biases(accumulate):
    gen = torch.Generator().manual_seed(3)
    R, D, I = 3, 37, 45
    x = torch.randn(R, D, generator=gen)
    gamma = 1 + 0.1 * torch.randn(D, generator=gen)
    wg, wu = torch.randn(I, D, generator=gen) / 6, torch.randn(I, D, generator=gen) / 6
    wd = torch.randn(D, I, generator=gen) / 6
    bg, bu, bd = (torch.randn(n, generator=gen) for n in (I, I, D))
    xn = _rms(x, gamma, 1e-5)
    g, u = xn @ wg.T + bg, xn @ wu.T + bu
    y = (g * torch.sigmoid(g) * u) @ wd.T + bd
    residual = torch.randn(R, D, generator=gen)
    out = residual.clone() if accumulate else torch.full((R, D), float("nan"))
    op = SimpleNamespace(
        reads=["x"],
        writes=["out"],
        weights={"gate": wg, "up": wu, "down": wd, "gate_b": bg, "up_b": bu, "down_b": bd, "norm": gamma},
        attrs={"eps": 1e-5, "act": "silu", "beta": 4.0, "linear_beta": 25.0, "accumulate": accumulate},
    )
    dense.mlp(op, SimpleNamespace(buf={"x": x, "out": out}))
    torch.testing.assert_close(out, y + residual if accumulate else y, rtol=1e-4, atol=1e-4)


def test_lm_head_uses_the_norm_eps():
    """Hidden states of tiny magnitude (|x| ~ 1e-3, mean x² ~ 1e-6): the final norm's eps (1e-5 here) is
    most of the denominator, so dropping or changing it is visible."""
    gen = torch.Generator().manual_seed(4)
    R, D, V = 2, 23, 41
    x = torch.randn(R, D, generator=gen) * 1e-3
    gamma = 1 + 0.1 * torch.randn(D, generator=gen)
    w = torch.randn(V, D, generator=gen)
    want = _rms(x, gamma, 1e-5) @ w.T
    logits = torch.full((R, V), float("nan"))
    op = SimpleNamespace(reads=["x"], writes=["logits"], weights={"w": w, "norm": gamma}, attrs={"eps": 1e-5})
    dense.lm_head(op, SimpleNamespace(buf={"x": x, "logits": logits}))
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-5)
