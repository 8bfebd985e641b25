"""MXFP4 (OCP microscaling FP4) weights, as in Kimi K3's routed experts (compressed-tensors
``mxfp4-pack-quantized``).

A row of K input values is stored as
  packed [ceil(K/2)] uint8: two E2M1 codes per byte, the low nibble holding the even element;
         code bit 3 = sign, bits 0-2 index the magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  scale  [ceil(K/32)] uint8: E8M0 exponent s, factor 2^(s-127), one per 32 consecutive values.
  w[k] = E2M1(code[k]) · 2^(scale[k // 32] - 127).
A ragged last group (K not a multiple of 32) is zero-padded.
"""

from __future__ import annotations

import torch

GROUP = 32
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# The largest scale byte the loader accepts: every backend decodes s <= 240 to the same finite 2^(s-127).
# 255 is NaN in E8M0; above 240 the GPU decoder (kernels/gemv.py ``mxfp4_decode``, which folds 2^14 into the
# fp32 exponent field s + 14) gives inf, and so NaN for zero codes, where the reference and CPU give 2^(s-127).
MAX_SCALE = 240


def e2m1_table(dtype=torch.float32, device="cpu") -> torch.Tensor:
    """[16] value of each 4-bit code (codes 8..15 are the negatives of 0..7)."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=dtype, device=device)
    return torch.cat([mags, -mags])


def packed_shape(n: int, k: int) -> tuple[int, int]:
    return n, (k + 1) // 2


def scale_shape(n: int, k: int) -> tuple[int, int]:
    return n, (k + GROUP - 1) // GROUP


def dequantize(packed: torch.Tensor, scale: torch.Tensor, k: int, dtype=torch.float32) -> torch.Tensor:
    """packed [..., N, ceil(K/2)] uint8, scale [..., N, ceil(K/32)] uint8 -> weights [..., N, K] in dtype."""
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)[..., :k].long()
    values = e2m1_table(torch.float32, packed.device)[codes]
    factors = torch.exp2(scale.float() - 127.0)
    factors = torch.where(scale == 255, torch.full_like(factors, float("nan")), factors)
    values = values * factors.repeat_interleave(GROUP, dim=-1)[..., :k]
    return values.to(dtype)


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest MXFP4 of w [..., N, K]: per group of 32 the smallest power-of-two scale with
    amax / scale <= 6, then the nearest E2M1 magnitude, a tie going to the even code (mantissa bit 0, as IEEE
    roundTiesToEven: 0.75 -> 1, 1.75 -> 2, 3.5 -> 4, 2.5 -> 2). Returns (packed, scale) uint8."""
    k = w.shape[-1]
    pad = (-k) % GROUP
    wf = torch.nn.functional.pad(w.float(), (0, pad))
    groups = wf.view(*wf.shape[:-1], -1, GROUP)
    amax = groups.abs().amax(-1)
    exponent = torch.ceil(torch.log2(amax.clamp_min(2.0**-126) / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)[..., None]
    mags = torch.tensor(E2M1_MAGNITUDES, device=w.device)
    distance = (scaled.abs()[..., None] - mags).abs()
    nearest = distance == distance.amin(-1, keepdim=True)  # one magnitude, or two neighbours at a tie
    odd = torch.arange(len(E2M1_MAGNITUDES), device=w.device) % 2
    index = ((~nearest) * 2 + odd).argmin(-1)  # the nearest; of two, the even code
    codes = (index + 8 * (scaled < 0).long()).view(*wf.shape[:-1], -1)[..., :k]
    if k % 2:
        codes = torch.nn.functional.pad(codes, (0, 1))
    codes = codes.view(*codes.shape[:-1], -1, 2)
    packed = (codes[..., 0] | (codes[..., 1] << 4)).to(torch.uint8)
    scale = (exponent + 127).to(torch.uint8)
    return packed, scale
