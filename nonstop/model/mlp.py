"""Gated MLP: y = W_down · act(W_gate x, W_up x), used for dense layers, shared and routed experts."""

from __future__ import annotations

import torch
from torch import nn

from nonstop.config_types import SITU_BETA, SITU_LINEAR_BETA
from nonstop.model.activations import glu
from nonstop.model.linear import Linear, linear


def gated_mlp(
    x,
    w_gate,
    w_up,
    w_down,
    act: str = "silu",
    beta: float = SITU_BETA,
    linear_beta: float = SITU_LINEAR_BETA,
    biases=(None, None, None),
):
    """x [..., D] -> [..., D]: W_down glu(W_gate x + b_g, W_up x + b_u) + b_d; weights [I, D], [I, D], [D, I]."""
    h = glu(linear(x, w_gate, biases[0]), linear(x, w_up, biases[1]), act, beta, linear_beta)
    return linear(h, w_down, biases[2])


class GatedMLP(nn.Module):
    """gate_proj / up_proj / down_proj, as named in every checkpoint family."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        act: str = "silu",
        beta: float = SITU_BETA,
        linear_beta: float = SITU_LINEAR_BETA,
        bias: bool = False,
    ):
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, bias)
        self.up_proj = Linear(hidden, intermediate, bias)
        self.down_proj = Linear(intermediate, hidden, bias)
        self.act, self.beta, self.linear_beta = act, beta, linear_beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        biases = (self.gate_proj.bias, self.up_proj.bias, self.down_proj.bias)
        return gated_mlp(
            x,
            self.gate_proj.weight,
            self.up_proj.weight,
            self.down_proj.weight,
            self.act,
            self.beta,
            self.linear_beta,
            biases,
        )
