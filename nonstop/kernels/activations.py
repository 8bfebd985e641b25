"""Activations of the gated MLPs (dense MLP, shared and routed experts): ``model/activations.glu`` in Triton.

``glu_tile(g, u, ACT, beta, linear_beta, OUT_TY)`` on fp32 g, u holding model-dtype values, rounded as
the twin rounds them:
    SILU:  (silu(g).to(OUT_TY) · u).to(OUT_TY)                       (SwiGLU)
    SITU:  (β1·tanh(g/β1)·σ(g) · β2·tanh(u/β2)).to(OUT_TY)            (K3's SiTU-GLU)
``tanh`` needs no libdevice (the interpreter has none): an odd Taylor polynomial near 0, where
1 - e^{-2|z|} would cancel, (1 - e^{-2|z|}) / (1 + e^{-2|z|}) elsewhere.
"""

from __future__ import annotations

import triton
import triton.language as tl

SILU: tl.constexpr = tl.constexpr(0)
SITU: tl.constexpr = tl.constexpr(1)


def act_code(name: str | None) -> int:
    """The ``ACT`` constexpr of an op's ``act`` attribute (``"situ"`` or SwiGLU)."""
    return 1 if name == "situ" else 0


@triton.jit
def sigmoid(z):
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def tanh(z):
    """fp32 tanh (see the module docstring)."""
    a = tl.abs(z)
    e = tl.exp(-2.0 * a)
    far = (1.0 - e) / (1.0 + e)
    a2 = a * a
    near = a * (1.0 + a2 * (-1.0 / 3.0 + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0))))
    t = tl.where(a < 0.125, near, far)
    return tl.where(z < 0, -t, t)


@triton.jit
def glu_tile(g, u, ACT: tl.constexpr, beta, linear_beta, OUT_TY: tl.constexpr):
    """The gated activation of fp32 g, u (same shape), returned in OUT_TY (see the module docstring)."""
    if ACT == SITU:
        h = beta * tanh(g / beta) * sigmoid(g) * (linear_beta * tanh(u / linear_beta))
    else:
        h = (g * sigmoid(g)).to(OUT_TY).to(tl.float32) * u
    return h.to(OUT_TY)
