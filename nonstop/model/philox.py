"""Philox4x32-10 counter-based random numbers in plain torch, bit-identical to Triton's ``tl.philox``.

Philox (Salmon et al., SC'11) maps a 128-bit counter (c0, c1, c2, c3) and a 64-bit key (k0, k1) to four
random 32-bit words through 10 rounds of
    (c0, c1, c2, c3) <- (hi(B·c2) ^ c1 ^ k0,  lo(B·c2),  hi(A·c0) ^ c3 ^ k1,  lo(A·c0)),
    (k0, k1) <- (k0 + 0x9E3779B9, k1 + 0xBB67AE85)          (all mod 2^32)
with A = 0xD2511F53, B = 0xCD9E8D57. Triton's ``tl.philox(seed, c0, c1, c2, c3)`` uses the key
k0 = seed mod 2^32, k1 = (seed >> 32) mod 2^32 of a 64-bit seed; ``tl.randint4x(seed, offset)`` is
``tl.philox(seed, offset, 0, 0, 0)`` for 32-bit offsets.

The sampler's noise (``gumbel_noise``): vocabulary entry i of a row with key ``seed`` at step ``offset``
takes word i % 4 of philox(seed; c0 = i // 4, c1 = offset mod 2^32, c2 = offset >> 32, c3 = 0); the
word w becomes the uniform u = (2·(w >> 9) + 1) / 2^24 in (0, 1) (exact in fp32) and the Gumbel noise
g = -log(-log u). The LM-head sampling kernel (``nonstop/kernels/sample.py``) draws the same numbers.

Words are carried as int64 tensors holding values in [0, 2^32); products are split into 16-bit halves
so no intermediate exceeds 2^63.
"""

from __future__ import annotations

import math

import torch

MASK32 = 0xFFFFFFFF
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85
ROUND_A, ROUND_B = 0xD2511F53, 0xCD9E8D57


def _mul_hi_lo(a: torch.Tensor, const: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of the 64-bit product a · const, for a in [0, 2^32) (int64 tensor)."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    c_lo, c_hi = const & 0xFFFF, const >> 16
    ll, lh, hl, hh = a_lo * c_lo, a_lo * c_hi, a_hi * c_lo, a_hi * c_hi
    mid = (ll >> 16) + (lh & 0xFFFF) + (hl & 0xFFFF)
    lo = ((mid & 0xFFFF) << 16) | (ll & 0xFFFF)
    hi = hh + (lh >> 16) + (hl >> 16) + (mid >> 16)
    return hi & MASK32, lo


def philox4x32(seed, c0, c1=0, c2=0, c3=0, rounds: int = 10) -> tuple[torch.Tensor, ...]:
    """Four int64 tensors of 32-bit words: Philox4x32-``rounds`` of counter (c0..c3) under the 64-bit
    key ``seed`` (an int or an int64 tensor broadcastable with the counters)."""
    words = [torch.as_tensor(c, dtype=torch.int64) & MASK32 for c in (c0, c1, c2, c3)]
    shape = torch.broadcast_shapes(*(w.shape for w in words), torch.as_tensor(seed).shape)
    x0, x1, x2, x3 = (w.expand(shape).clone() for w in words)
    seed = torch.as_tensor(seed, dtype=torch.int64).expand(shape)
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    for _ in range(rounds):
        hi_b, lo_b = _mul_hi_lo(x2, ROUND_B)
        hi_a, lo_a = _mul_hi_lo(x0, ROUND_A)
        x0, x1, x2, x3 = hi_b ^ x1 ^ k0, lo_b, hi_a ^ x3 ^ k1, lo_a
        k0, k1 = (k0 + KEY_A) & MASK32, (k1 + KEY_B) & MASK32
    return x0, x1, x2, x3


def uniform_from_word(word: torch.Tensor) -> torch.Tensor:
    """u = (2·(w >> 9) + 1) / 2^24: fp32 in (0, 1), exactly representable (23 random bits)."""
    return ((word >> 9) * 2 + 1).to(torch.float32) * (2.0**-24)


# Bounds of the noise: u lies in [2^-24, 1 - 2^-24], so g = -log(-log u) lies in [GUMBEL_MIN, GUMBEL_MAX].
GUMBEL_MIN = -math.log(-math.log(2.0**-24))  # -2.81
GUMBEL_MAX = -math.log(-math.log1p(-(2.0**-24)))  # 16.64


def gumbel_noise_at(seed: int, offset: int, index: torch.Tensor) -> torch.Tensor:
    """fp32 Gumbel noise of the vocabulary entries ``index`` (int64 [N]) of the row with key ``seed`` at step
    ``offset``: ``gumbel_noise(seed, offset, V)[index]`` without drawing the other V - N entries."""
    index = index.to(device="cpu", dtype=torch.int64)
    quads, back = torch.unique(index // 4, return_inverse=True)  # one Philox call per group of four entries
    words = torch.stack(philox4x32(seed, quads, offset & MASK32, (offset >> 32) & MASK32, 0), dim=-1)
    u = uniform_from_word(words[back, index % 4])
    return -torch.log(-torch.log(u))


def gumbel_noise(seed, offset, vocab: int) -> torch.Tensor:
    """[..., vocab] fp32 Gumbel noise of sampling rows with key ``seed`` at step ``offset`` (ints, or int64
    tensors of one shape [...]); see the module docstring for the stream."""
    seed = torch.as_tensor(seed, dtype=torch.int64)[..., None]
    offset = torch.as_tensor(offset, dtype=torch.int64)[..., None]
    quads = torch.arange(-(-vocab // 4), dtype=torch.int64)
    words = torch.stack(philox4x32(seed, quads, offset & MASK32, (offset >> 32) & MASK32, 0), dim=-1)
    u = uniform_from_word(words.flatten(-2)[..., :vocab])
    return -torch.log(-torch.log(u))
