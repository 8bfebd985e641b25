"""Triton building blocks shared by the attention super-ops (``mla.py``, ``gqa.py``).

Everything here is a ``@triton.jit`` device function (inlined into its caller) or a small host
helper. Conventions:
* a step has R <= 16 rows; row r is token t = r % T of sequence b = r // T, at absolute position
  ``start[b] + t`` in slot ``slots[b]``. Row tiles are ``BLOCK_R`` (a power of two >= 16, so that
  ``tl.dot`` is legal on a GPU) with rows >= R masked.
* "DT" is the model dtype (read off a pointer's element type); accumulation is fp32.
* ``mm`` is the only matmul: on a GPU a tensor-core ``tl.dot`` of 16-bit operands (fp32 accumulate,
  "ieee" for fp32 models); under ``TRITON_INTERPRET=1`` the operands are upcast to fp32 first,
  because the interpreter's bf16 dot is wrong (operands are rounded to DT before the upcast, so
  the result is what the GPU computes up to summation order).
* split-KV attention writes one *partial* per (query item, split): the running max ``m``, the
  softmax denominator ``l`` (``ml`` [items, NS, 2]) and the unnormalised value sum ``acc``
  ([items, NS, D]), all fp32; ``merge_splits`` folds them into softmax(...)·V.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
NEG = tl.constexpr(-1.0e30)  # "minus infinity" that keeps exp(NEG - NEG) finite


def pow2(n: int, lo: int = 16) -> int:
    """The smallest power of two >= max(n, lo) (``lo`` = 16 keeps ``tl.dot`` shapes legal)."""
    return max(lo, triton.next_power_of_2(max(1, int(n))))


def dot_precision(dtype: torch.dtype) -> str:
    """``input_precision`` of ``tl.dot``: exact fp32 for fp32 models, tensor-core default otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"


def num_sms(device) -> int:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


_WORKSPACE: dict = {}


def workspace(name: str, numel: int, dtype: torch.dtype, device, zero: bool = False) -> torch.Tensor:
    """A reusable flat scratch tensor of at least ``numel`` elements (grown, never shrunk).

    ``zero=True`` tensors (counters) are created zeroed; the kernels that use them leave them at
    zero when they finish, so they are never cleared again.
    """
    key = (name, str(device), dtype)
    t = _WORKSPACE.get(key)
    if t is None or t.numel() < numel:
        t = (torch.zeros if zero else torch.empty)(max(numel, 1), dtype=dtype, device=device)
        _WORKSPACE[key] = t
    return t


def choose_split(context_bound: int, programs_per_split: int, block_s: int, device, split_tokens: int | None = None,
                 min_split: int = 256, programs_per_sm: int = 2) -> tuple[int, int]:
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


# ----------------------------------------------------------------------------- arithmetic


@triton.jit
def mm(a, b, DOT_F32: tl.constexpr, PREC: tl.constexpr):
    """a [M, K] @ b [K, N] -> [M, N] fp32 (see the module docstring for the interpreter path)."""
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def row_rstd(x_ptr, x_stride, R, K, eps, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / sqrt(mean_k x[r, k]² + eps) for rows r < R of x [R, K] (row stride ``x_stride``) -> [BLOCK_R] fp32."""
    rows = tl.arange(0, BLOCK_R)
    total = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * x_stride + k[None, :], mask=(rows < R)[:, None] & (k < K)[None, :], other=0.0).to(tl.float32)
        total += tl.sum(x * x, axis=1)
    return 1.0 / tl.sqrt(total / K + eps)


@triton.jit
def rms_apply(x, rstd, w, DT: tl.constexpr):
    """The twin's RMSNorm rounding: w ⊙ (x · rstd rounded to DT), rounded to DT. x [BR, BK], rstd [BR], w [BK]."""
    xn = (x.to(tl.float32) * rstd[:, None]).to(DT)
    return (w.to(tl.float32)[None, :] * xn.to(tl.float32)).to(DT)


@triton.jit
def gemv_rows(x_ptr, x_stride, R, K, rstd, norm_ptr, w_ptr, w_stride, w_rows, w_mask,
              HAS_NORM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
              NUM_STAGES: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr):
    """y[r, n] = Σ_k x̂[r, k] · W[w_rows[n], k] -> [BLOCK_R, BLOCK_N] fp32.

    x [R, K] (row stride ``x_stride``); x̂ = RMSNorm(x; norm, rstd) when HAS_NORM else x. W rows are
    gathered by ``w_rows`` [BLOCK_N] (masked by ``w_mask``), so a tile can take e.g. the even and odd
    channels of a RoPE pair separately. Streams the W rows once, BLOCK_K columns at a time.
    """
    DT: tl.constexpr = w_ptr.dtype.element_ty
    rows = tl.arange(0, BLOCK_R)
    rmask = rows < R
    acc = tl.zeros([BLOCK_R, w_rows.shape[0]], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        w = tl.load(w_ptr + w_rows[:, None] * w_stride + k[None, :], mask=w_mask[:, None] & kmask[None, :], other=0.0)
        x = tl.load(x_ptr + rows[:, None] * x_stride + k[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        if HAS_NORM:
            x = rms_apply(x, rstd, tl.load(norm_ptr + k, mask=kmask, other=0.0), DT)
        acc += mm(x.to(DT), tl.trans(w), DOT_F32, PREC)
    return acc


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
        a_s = tl.load(acc_ptr + (base + s)[:, None] * D + d[None, :], mask=ok[:, None] & (d < D)[None, :], other=0.0, cache_modifier=".cg")
        new = tl.maximum(mx, m_s)
        alpha = tl.exp(mx - new)
        beta = tl.where(ok, tl.exp(m_s - new), 0.0)
        den = den * alpha + l_s * beta
        num = num * alpha[:, None] + a_s * beta[:, None]
        mx = new
    return num / tl.where(den > 0, den, 1.0)[:, None]
