"""Linear weights in the CPU executor's low-precision formats.

A packed weight stands in for a [N, K] weight tensor in the Program: ``model.linear.linear`` calls
its ``linear(x, bias)`` (x [..., K] -> [..., N] fp32). The products run in the C++ kernels
(``kernels.py``: fp32 weights as they are, 16-bit or 8-bit weights converted to fp32 in registers; fp32
accumulation) on the weights in row tiles (``tile_rows``, the layout ``gemv.cpp`` streams); where those
kernels are unavailable, in torch on the dequantised weight (same result up to summation order).
A packed weight's ``stream`` (set by ``pack.pack_program``) has the kernel read it with non-temporal
prefetches: weights that no cache keeps from one step to the next then leave the caches to the rest of the step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nonstop.weights.quant import dequantize_int8, group_size, quantize_int8

F32_CHUNK, BF16_CHUNK, INT8_CHUNK = 16, 32, 16  # columns per chunk of a row tile (gemv.cpp): 64 bytes a row


def tile_rows(w: torch.Tensor, chunk: int) -> torch.Tensor:
    """W [N, K] -> row tiles [Np, Kp] (Np = N rounded up to 4, Kp = K rounded up to ``chunk``, zeros
    there): tile t (rows 4t..4t+3) is stored as [K/chunk][4][chunk], so it is one contiguous stream."""
    N, K = w.shape
    Np, Kp = -(-N // 4) * 4, -(-K // chunk) * chunk
    padded = F.pad(w, (0, Kp - K, 0, Np - N))
    return padded.view(Np // 4, 4, Kp // chunk, chunk).transpose(1, 2).contiguous().view(Np, Kp)


def untile_rows(tiles: torch.Tensor, N: int, K: int, chunk: int) -> torch.Tensor:
    """``tile_rows``' inverse: row tiles [Np, Kp] -> W [N, K]."""
    Np, Kp = tiles.shape
    return tiles.view(Np // 4, Kp // chunk, 4, chunk).transpose(1, 2).reshape(Np, Kp)[:N, :K]


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).float().contiguous()


class F32Weight:
    """W [N, K] fp32 in row tiles (4 bytes per weight): at one to a few rows of x the tiled stream (one
    contiguous run per tile, which the hardware prefetcher follows) reads weights faster than a BLAS GEMM
    call on the plain matrix (bench/cpu_gemv.py). Without the kernels, the plain matrix and ``F.linear``."""

    streamed = ("w",)  # the tensors a product reads (``pack.place_on_huge_pages`` moves them)
    stream = False  # read with non-temporal prefetches (``pack.streams_weights``)

    def __init__(self, w: torch.Tensor, kernels: bool):
        w = w.float()
        self.kernels = kernels
        self.shape = w.shape
        self.w = tile_rows(w, F32_CHUNK) if kernels else w.contiguous()

    def dequantized(self) -> torch.Tensor:
        return untile_rows(self.w, *self.shape, F32_CHUNK) if self.kernels else self.w

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = _rows(x)
        if self.kernels:
            y = torch.ops.nonstop_cpu.linear_f32(rows, self.w, self.shape[0], self.stream)
        else:
            y = F.linear(rows, self.w)
        y = y.reshape(*x.shape[:-1], self.shape[0])
        return y if bias is None else y + bias.float()


class Bf16Weight:
    """W [N, K] stored as bf16 (2 bytes per weight)."""

    streamed = ("w",)
    stream = False

    def __init__(self, w: torch.Tensor, kernels: bool):
        w = w.to(torch.bfloat16)
        self.kernels = kernels
        self.shape = w.shape
        self.w = tile_rows(w, BF16_CHUNK) if kernels else w.contiguous()  # row tiles for the kernel

    def dequantized(self) -> torch.Tensor:
        w = untile_rows(self.w, *self.shape, BF16_CHUNK) if self.kernels else self.w
        return w.float()

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = _rows(x)
        if self.kernels:
            y = torch.ops.nonstop_cpu.linear_bf16(rows, self.w, self.shape[0], self.stream)
        else:
            y = F.linear(rows, self.w.float())
        y = y.reshape(*x.shape[:-1], self.shape[0])
        return y if bias is None else y + bias.float()


class Int8Weight:
    """W [N, K] as int8 Q [N, K] and fp32 scales [N, K/group] (``weights.quant``; 1 byte per weight).
    For the kernel, Q in row tiles and the scales' rows padded to match; a group must then be whole
    16-column chunks (or the whole row): other groups compute in torch."""

    streamed = ("q", "s")
    stream = False

    def __init__(self, w: torch.Tensor, kernels: bool, group: int | None = None):
        N, K = w.shape
        self.group = group or group_size(K)
        q, s = quantize_int8(w, self.group)
        self.kernels = kernels and (self.group % INT8_CHUNK == 0 or self.group == K)
        self.shape = q.shape
        if self.kernels:
            q, s = tile_rows(q, INT8_CHUNK), F.pad(s, (0, 0, 0, -(-N // 4) * 4 - N))
        self.q, self.s = q, s

    def dequantized(self) -> torch.Tensor:
        if not self.kernels:
            return dequantize_int8(self.q, self.s)
        return dequantize_int8(untile_rows(self.q, *self.shape, INT8_CHUNK), self.s[: self.shape[0]])

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = _rows(x)
        y = (
            torch.ops.nonstop_cpu.linear_int8(rows, self.q, self.s, self.shape[0], self.stream)
            if self.kernels
            else F.linear(rows, self.dequantized())
        )
        y = y.reshape(*x.shape[:-1], self.shape[0])
        return y if bias is None else y + bias.float()


FORMATS = {"float32": F32Weight, "bfloat16": Bf16Weight, "int8": Int8Weight}
