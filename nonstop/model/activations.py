"""Gated activations of the MLPs: SwiGLU (SiLU-GLU) and K3's SiTU-GLU."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nonstop.config_types import SITU_BETA, SITU_LINEAR_BETA


def silu_glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: silu(g) ⊙ u, with silu(g) = g·σ(g). gate, up: [..., I]."""
    return F.silu(gate) * up


def situ_glu(
    gate: torch.Tensor, up: torch.Tensor, beta: float = SITU_BETA, linear_beta: float = SITU_LINEAR_BETA
) -> torch.Tensor:
    """SiTU-GLU (Kimi K3): [β1·tanh(g/β1)·σ(g)] ⊙ [β2·tanh(u/β2)], in fp32, cast to the input dtype.

    Both factors are soft-capped, so |output| < β1·β2 (= 100 for K3's β1=4, β2=25). gate, up: [..., I].
    """
    g = gate.float()
    u = up.float()
    out = beta * torch.tanh(g / beta) * torch.sigmoid(g) * (linear_beta * torch.tanh(u / linear_beta))
    return out.to(gate.dtype)


def glu(
    gate: torch.Tensor, up: torch.Tensor, act: str, beta: float = SITU_BETA, linear_beta: float = SITU_LINEAR_BETA
) -> torch.Tensor:
    """Dispatch on a config's hidden_act: ``silu`` or ``situ``."""
    if act == "situ":
        return situ_glu(gate, up, beta, linear_beta)
    return silu_glu(gate, up)
