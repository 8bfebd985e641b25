"""Linear weights in the CPU executor's low-precision formats.

A packed weight stands in for a [N, K] weight tensor in the Program: ``model.linear.linear`` calls
its ``linear(x, bias)`` (x [..., K] -> [..., N] fp32). The products run in the C++ kernels
(``kernels.py``: 16-bit or 8-bit weights converted to fp32 in registers, fp32 accumulation); where
those are unavailable, in torch on the dequantised weight (same result up to summation order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nonstop.weights.quant import dequantize_int8, group_size, quantize_int8


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).float().contiguous()


class Bf16Weight:
    """W [N, K] stored as bf16 (2 bytes per weight)."""

    def __init__(self, w: torch.Tensor, kernels: bool):
        self.w = w.to(torch.bfloat16).contiguous()
        self.kernels = kernels
        self.shape = self.w.shape

    def dequantized(self) -> torch.Tensor:
        return self.w.float()

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = _rows(x)
        y = torch.ops.nonstop_cpu.linear_bf16(rows, self.w) if self.kernels else F.linear(rows, self.w.float())
        y = y.reshape(*x.shape[:-1], self.shape[0])
        return y if bias is None else y + bias.float()


class Int8Weight:
    """W [N, K] as int8 Q [N, K] and fp32 scales [N, K/group] (``weights.quant``; 1 byte per weight)."""

    def __init__(self, w: torch.Tensor, kernels: bool, group: int | None = None):
        self.group = group or group_size(w.shape[-1])
        self.q, self.s = quantize_int8(w, self.group)
        self.kernels = kernels
        self.shape = self.q.shape

    def dequantized(self) -> torch.Tensor:
        return dequantize_int8(self.q, self.s)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = _rows(x)
        y = (
            torch.ops.nonstop_cpu.linear_int8(rows, self.q, self.s, self.group)
            if self.kernels
            else F.linear(rows, self.dequantized())
        )
        y = y.reshape(*x.shape[:-1], self.shape[0])
        return y if bias is None else y + bias.float()


FORMATS = {"bfloat16": Bf16Weight, "int8": Int8Weight}
