"""Triton building blocks shared by the attention super-ops (``mla.py``, ``gqa.py``).

Everything here is a ``@triton.jit`` device function (inlined into its caller) or a small host
helper. Conventions:
* a step has R <= 16 rows; row r is token t = r % T of sequence b = r // T, at absolute position
  ``start[b] + t`` in slot ``slots[b]``. Row tiles are ``BLOCK_R`` (a power of two >= 16, so that
  ``tl.dot`` is legal on a GPU) with rows >= R masked.
* "DT" is the model dtype (read off a pointer's element type); accumulation is fp32. Projections use
  the GEMV tile (``gemv.gemv_rows``), every other product ``gemv.mm`` (``platform.dot_mode``).
* split-KV attention writes one *partial* per (query item, split): the running max ``m``, the
  softmax denominator ``l`` (``ml`` [items, NS, 2]) and the unnormalised value sum ``acc``
  ([items, NS, D]), all fp32; ``merge_splits`` folds them into softmax(...)·V.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nonstop.kernels.platform import num_sms

NEG = tl.constexpr(-1.0e30)  # "minus infinity" that keeps exp(NEG - NEG) finite


def choose_split(
    context_bound: int,
    programs_per_split: int,
    block_s: int,
    device,
    split_tokens: int | None = None,
    min_split: int = 256,
    programs_per_sm: int = 2,
) -> tuple[int, int]:
    """(tokens per KV split, number of splits NS) for keys 0..context_bound-1.

    Without ``split_tokens``: enough splits to give about ``programs_per_sm`` programs per SM (there are
    ``programs_per_split`` programs per split), but no split shorter than ``min_split`` keys. The split
    length is a multiple of ``block_s``.
    """
    context_bound = max(1, context_bound)
    if split_tokens is None:
        want = max(1, -(-programs_per_sm * num_sms(device) // max(1, programs_per_split)))
        splits = max(1, min(want, context_bound // min_split))
        split_tokens = -(-context_bound // splits)
    split_tokens = -(-split_tokens // block_s) * block_s
    return split_tokens, -(-context_bound // split_tokens)


# ----------------------------------------------------------------------------- RoPE


@triton.jit
def rope_pair_channels(i, HALF, INTERLEAVED: tl.constexpr):
    """Channels (first, second) of RoPE pair i: GPT-J (2i, 2i+1) or NeoX (i, i + HALF)."""
    if INTERLEAVED:
        return 2 * i, 2 * i + 1
    else:
        return i, i + HALF


@triton.jit
def rope_rotate(a, b, pos, inv_freq_ptr, i, i_mask, magnitude):
    """(a, b) -> (a·cos - b·sin, b·cos + a·sin), angle = pos · inv_freq[i], cos/sin scaled by magnitude.

    a, b [BLOCK_R, BLOCK_P] fp32 (the two channels of each pair), pos [BLOCK_R] int, i [BLOCK_P].
    """
    inv = tl.load(inv_freq_ptr + i, mask=i_mask, other=0.0).to(tl.float32)
    angle = pos.to(tl.float32)[:, None] * inv[None, :]
    cos = tl.cos(angle) * magnitude
    sin = tl.sin(angle) * magnitude
    return a * cos - b * sin, b * cos + a * sin


# ----------------------------------------------------------------------------- rows and the page table


@triton.jit
def row_positions(start_ptr, rows, T, rmask):
    """Absolute positions start[r // T] + r % T of rows [BLOCK_R] (int32: position arithmetic stays 32-bit,
    as 64-bit division compiles to subroutine calls that spill registers)."""
    return tl.load(start_ptr + rows // T, mask=rmask, other=0).to(tl.int32) + rows % T


@triton.jit
def pool_rows(table_ptr, table_stride, slot, positions, PAGE_SIZE: tl.constexpr, mask):
    """Pool rows table[slot, p // PAGE_SIZE] · PAGE_SIZE + p % PAGE_SIZE (int64) of int32 positions;
    slot scalar or shaped like positions."""
    page = tl.load(table_ptr + slot * table_stride + positions // PAGE_SIZE, mask=mask, other=0)
    return page * PAGE_SIZE + positions % PAGE_SIZE


# ----------------------------------------------------------------------------- split-KV softmax


@triton.jit
def online_softmax_step(scores, visible, mx, den, acc):
    """Fold one key tile into the running (max, denominator): returns p [M, S] fp32 (0 where not visible),
    the new max and denominator, and ``acc`` rescaled to the new max (the caller adds p·V)."""
    scores = tl.where(visible, scores, NEG)
    new = tl.maximum(mx, tl.max(scores, axis=1))
    alpha = tl.exp(mx - new)
    p = tl.where(visible, tl.exp(scores - new[:, None]), 0.0)
    return p, new, den * alpha + tl.sum(p, axis=1), acc * alpha[:, None]


@triton.jit
def store_partial(ml_ptr, acc_ptr, items, item_mask, split, NS, D, mx, den, acc, BLOCK_D: tl.constexpr):
    """Write the partial of ``split`` for query items [BLOCK_M]: ml[item, split] = (mx, den), acc[item, split, :D]."""
    slot = items.to(tl.int64) * NS + split
    tl.store(ml_ptr + slot * 2, mx, mask=item_mask)
    tl.store(ml_ptr + slot * 2 + 1, den, mask=item_mask)
    d = tl.arange(0, BLOCK_D)
    tl.store(acc_ptr + slot[:, None] * D + d[None, :], acc, mask=item_mask[:, None] & (d < D)[None, :])


@triton.jit
def merge_splits(ml_ptr, acc_ptr, items, n_valid, NS, D, BLOCK_D: tl.constexpr):
    """softmax-weighted value of query items [BLOCK_I] from their splits 0..n_valid[i]-1 -> [BLOCK_I, BLOCK_D] fp32.

    o = Σ_s e^(m_s - M) acc_s / Σ_s e^(m_s - M) l_s with M = max_s m_s. Items with n_valid = 0 give 0.
    Loads bypass L1 (``.cg``): the partials were written by other programs of the same launch.
    """
    d = tl.arange(0, BLOCK_D)
    base = items.to(tl.int64) * NS
    mx = tl.zeros([items.shape[0]], dtype=tl.float32) + NEG
    den = tl.zeros([items.shape[0]], dtype=tl.float32)
    num = tl.zeros([items.shape[0], BLOCK_D], dtype=tl.float32)
    for s in range(0, tl.max(n_valid, axis=0)):
        ok = s < n_valid
        m_s = tl.load(ml_ptr + (base + s) * 2, mask=ok, other=NEG, cache_modifier=".cg")
        l_s = tl.load(ml_ptr + (base + s) * 2 + 1, mask=ok, other=0.0, cache_modifier=".cg")
        a_s = tl.load(
            acc_ptr + (base + s)[:, None] * D + d[None, :],
            mask=ok[:, None] & (d < D)[None, :],
            other=0.0,
            cache_modifier=".cg",
        )
        new = tl.maximum(mx, m_s)
        alpha = tl.exp(mx - new)
        beta = tl.where(ok, tl.exp(m_s - new), 0.0)
        den = den * alpha + l_s * beta
        num = num * alpha[:, None] + a_s * beta[:, None]
        mx = new
    return num / tl.where(den > 0, den, 1.0)[:, None]
