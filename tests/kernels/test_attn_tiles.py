"""The attention tile helpers (``nonstop/kernels/attn_tiles.py``) against torch: RoPE pairs and the merge
of several splits."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from nonstop.kernels.attn_tiles import merge_splits, rope_pair_channels, rope_rotate
from nonstop.model.rope import apply_rope, rope_cos_sin


@triton.jit
def _rope_probe(
    x_ptr,
    pos_ptr,
    inv_ptr,
    out_ptr,
    R,
    D,
    magnitude,
    INTERLEAVED: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    r = tl.arange(0, BLOCK_R)
    i = tl.arange(0, BLOCK_P)
    imask = i < D // 2
    first, second = rope_pair_channels(i, D // 2, INTERLEAVED)
    mask = (r < R)[:, None] & imask[None, :]
    a = tl.load(x_ptr + r[:, None] * D + first[None, :], mask=mask, other=0.0)
    b = tl.load(x_ptr + r[:, None] * D + second[None, :], mask=mask, other=0.0)
    a, b = rope_rotate(a, b, tl.load(pos_ptr + r, mask=r < R, other=0), inv_ptr, i, imask, magnitude)
    tl.store(out_ptr + r[:, None] * D + first[None, :], a, mask=mask)
    tl.store(out_ptr + r[:, None] * D + second[None, :], b, mask=mask)


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_rotate_matches_apply_rope(interleaved):
    gen = torch.Generator().manual_seed(4)
    R, D = 6, 12
    x = torch.randn(R, D, generator=gen)
    pos = torch.tensor([0, 1, 37, 300, 4095, 70000])
    inv = 1.0 / (500.0 ** (torch.arange(0, D, 2).float() / D))
    out = torch.empty_like(x)
    _rope_probe[(1,)](x, pos, inv, out, R, D, 1.3, INTERLEAVED=interleaved, BLOCK_R=8, BLOCK_P=8)
    cos, sin = rope_cos_sin(pos, inv, 1.3)
    torch.testing.assert_close(out, apply_rope(x, cos, sin, interleaved), rtol=1e-5, atol=1e-4)


@triton.jit
def _merge_probe(ml_ptr, acc_ptr, n_valid_ptr, out_ptr, I, NS, D, BLOCK_I: tl.constexpr, BLOCK_D: tl.constexpr):
    items = tl.arange(0, BLOCK_I)
    n_valid = tl.load(n_valid_ptr + items, mask=items < I, other=0)
    o = merge_splits(ml_ptr, acc_ptr, items, n_valid, NS, D, BLOCK_D)
    d = tl.arange(0, BLOCK_D)
    tl.store(out_ptr + items[:, None] * D + d[None, :], o, mask=(items < I)[:, None] & (d < D)[None, :])


@pytest.mark.parametrize("shift", [0.0, -300.0])
def test_merge_splits_equals_one_softmax_over_all_keys(shift):
    """Partials of a softmax over keys cut into splits merge to the softmax over the valid splits' keys; also
    with every score far below zero (``shift``), where a merge max started at 0 underflows the denominator
    and the output becomes 0."""
    gen = torch.Generator().manual_seed(5)
    I, NS, S, D = 5, 4, 6, 9  # items, splits, keys per split, value dim
    scores = torch.randn(I, NS, S, generator=gen) * 4 + shift
    values = torch.randn(I, NS, S, D, generator=gen)
    n_valid = torch.tensor([1, 4, 2, 3, 0])
    mx = scores.amax(-1)
    p = torch.exp(scores - mx[..., None])
    ml = torch.stack([mx, p.sum(-1)], -1).contiguous()
    acc = torch.einsum("isk,iskd->isd", p, values).contiguous()
    out = torch.empty(I, D)
    _merge_probe[(1,)](ml, acc, n_valid, out, I, NS, D, BLOCK_I=8, BLOCK_D=16)
    for i in range(I):
        n = int(n_valid[i])
        if n == 0:
            torch.testing.assert_close(out[i], torch.zeros(D))
            continue
        probs = torch.softmax(scores[i, :n].reshape(-1), 0)
        torch.testing.assert_close(out[i], probs @ values[i, :n].reshape(-1, D), rtol=1e-5, atol=1e-5)
