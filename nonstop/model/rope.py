"""Rotary position embeddings: inverse frequencies (default, linear, llama3, YaRN) and rotation
in the NeoX (two halves) or GPT-J (interleaved pairs) layout."""

from __future__ import annotations

import math

import torch

from nonstop.config import RopeConfig
from nonstop.config_parse import yarn_mscale


def _yarn_inv_freq(rope: RopeConfig, base_freq: torch.Tensor) -> torch.Tensor:
    """Blend extrapolated θ^(-2i/d) and interpolated θ^(-2i/d)/factor with a linear ramp between the
    correction dims of beta_fast / beta_slow rotations over the original context."""
    dim, theta = rope.dim, rope.theta
    original = rope.original_max_position

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp
    return base_freq / rope.factor * (1 - extrapolation_weight) + base_freq * extrapolation_weight


def _llama3_inv_freq(rope: RopeConfig, base_freq: torch.Tensor) -> torch.Tensor:
    """Llama 3: keep high frequencies, divide low ones by factor, interpolate smoothly between."""
    original = rope.original_max_position
    low_wavelen = original / rope.low_freq_factor
    high_wavelen = original / rope.high_freq_factor
    wavelen = 2 * math.pi / base_freq
    scaled = torch.where(wavelen > low_wavelen, base_freq / rope.factor, base_freq)
    smooth = (original / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_inv_freq(rope: RopeConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [dim/2] (fp32) and the cos/sin magnitude factor of the rope type."""
    base_freq = 1.0 / (rope.theta ** (torch.arange(0, rope.dim, 2, dtype=torch.int64, device="cpu").float() / rope.dim))
    if rope.kind == "default":
        return base_freq, 1.0
    if rope.kind == "linear":
        return base_freq / rope.factor, 1.0
    if rope.kind == "llama3":
        return _llama3_inv_freq(rope, base_freq), 1.0
    if rope.kind == "yarn":
        if rope.attention_factor is not None:
            magnitude = float(rope.attention_factor)
        elif rope.mscale and rope.mscale_all_dim:
            magnitude = yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim)
        else:
            magnitude = yarn_mscale(rope.factor)
        return _yarn_inv_freq(rope, base_freq), magnitude
    raise ValueError(f"unknown rope kind {rope.kind!r}")


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, magnitude: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [...] (int) -> cos, sin [..., dim/2] (fp32): angle = position · inv_freq."""
    angles = positions.float()[..., None] * inv_freq.to(positions.device)
    return angles.cos() * magnitude, angles.sin() * magnitude


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate channel pairs of x [..., dim] by the angles of cos/sin [..., dim/2] (broadcast over heads).

    NeoX pairs channel i with i + dim/2; GPT-J (interleaved) pairs 2i with 2i+1 and keeps them in place:
    (a, b) -> (a·cos - b·sin, b·cos + a·sin). Computed in fp32, returned in x.dtype.
    """
    xf = x.float()
    if interleaved:
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    else:
        half = xf.shape[-1] // 2
        a, b = xf[..., :half], xf[..., half:]
        out = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    return out.to(x.dtype)


class Rotary:
    """Precomputed inverse frequencies of one RopeConfig; ``cos_sin(positions)`` per step."""

    def __init__(self, rope: RopeConfig):
        self.rope = rope
        self.inv_freq, self.magnitude = rope_inv_freq(rope)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(positions, self.inv_freq, self.magnitude)

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope(x, cos, sin, self.rope.interleaved)
