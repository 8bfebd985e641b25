"""Bias-free linear layer whose weight is [out, in] like every checkpoint we load."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nonstop.model.rows import is_row_exact


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x Wᵀ (+ b): x [..., in], weight [out, in] -> [..., out]. In ``row_exact()`` mode each row is
    its own one-row product, bit-identical to the same row computed alone (``nonstop.model.rows``).
    ``weight`` may also be a packed low-precision weight (``runtime/cpu/packed.py``) computing it itself."""
    if not isinstance(weight, torch.Tensor):
        return weight.linear(x, bias)
    if is_row_exact() and x[..., 0].numel() > 1:
        rows = x.reshape(-1, 1, x.shape[-1])  # R one-row products in one batched call
        y = torch.bmm(rows, weight.t().expand(rows.shape[0], *weight.t().shape))
        y = y.reshape(*x.shape[:-1], weight.shape[0])
        return y if bias is None else y + bias
    return F.linear(x, weight, bias)


class Linear(nn.Module):
    """y = x Wᵀ (+ b). weight: [out, in]. Created uninitialised; the loader or synth fills it."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
