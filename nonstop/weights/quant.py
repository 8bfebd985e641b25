"""Weight-only 8-bit quantization: symmetric int8 with one fp32 scale per group of input columns.

For a weight W [N, K] and group size g (g divides K; g = K is per-channel):
  s[n, j] = max_{k ∈ group j} |W[n, k]| / 127          (1 where the group is all zeros)
  Q[n, k] = clamp(round(W[n, k] / s[n, k // g]), -127, 127)   int8
  Ŵ[n, k] = s[n, k // g] · Q[n, k]                     the weight the quantized model computes with
Error per element at most s/2 (half a quantization step).
"""

from __future__ import annotations

import torch

DEFAULT_GROUP = 128


def group_size(K: int, preferred: int = DEFAULT_GROUP) -> int:
    """``preferred`` when it divides K, else K (one scale per output channel)."""
    return preferred if 0 < preferred < K and K % preferred == 0 else K


def quantize_int8(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] float -> (Q [..., N, K] int8, s [..., N, K/group] fp32)."""
    K = w.shape[-1]
    if group <= 0 or K % group:
        raise ValueError(f"group size {group} does not divide the {K} input columns")
    blocks = w.float().reshape(*w.shape[:-1], K // group, group)
    scale = blocks.abs().amax(-1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(blocks / scale[..., None]), -127, 127).to(torch.int8)
    return q.reshape(w.shape), scale.contiguous()


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(Q [..., N, K] int8, s [..., N, G] fp32) -> Ŵ [..., N, K] fp32."""
    K, G = q.shape[-1], scale.shape[-1]
    blocks = q.float().reshape(*q.shape[:-1], G, K // G) * scale[..., None]
    return blocks.reshape(q.shape)
