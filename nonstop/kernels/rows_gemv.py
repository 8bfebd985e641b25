"""A GEMV tile for the few rows of a decode step: ``acc = x̂ Wᵀ`` for R <= 16 rows and BLOCK_N outputs.

Used by the KDA super-ops (and free for any family that wants it). Shapes:
  x [*, K] rows ``row0 .. row0 + n_rows - 1`` (row stride ``stride_x``), W [N, K] (row stride
  ``stride_w``), output tile ``acc [BLOCK_R, BLOCK_N]`` fp32 for outputs ``n0 .. n0 + BLOCK_N - 1``
  (rows >= n_rows and outputs >= N are zero).
  With ``HAS_NORM`` the rows are RMS-normalised on the fly, x̂ = w_norm ⊙ x / sqrt(mean(x²) + eps):
  the sum of squares is gathered in the same pass over K and the per-row scale applied at the end,
  acc[r, n] = rsqrt(mean_k x[r,k]² + eps) · Σ_k (w_norm[k] x[r,k]) W[n,k],
  so no tile waits for a separate norm (each tile re-reads the few x rows from L2).

GPU shape: one pass over the weight tile in BLOCK_K steps pipelined with ``tl.range(num_stages)``.
BLOCK_R == 1 (batch-1 decode) multiplies and reduces in fp32 registers; BLOCK_R >= 16 (a padded
row block) uses ``tl.dot`` with fp32 accumulation: operands in the weight dtype on a GPU, upcast to
fp32 with ``DOT_FP32`` (the interpreter's bf16 dot is wrong; an fp32 model wants ieee, not tf32).
"""

from __future__ import annotations

import triton
import triton.language as tl


def row_block(rows: int) -> int:
    """BLOCK_R for ``rows`` rows: 1 (reduction path) or a power of two >= 16 (tl.dot's minimum M)."""
    return 1 if rows == 1 else max(16, triton.next_power_of_2(rows))


@triton.jit
def rows_gemv(
    x_ptr, stride_x, row0, n_rows,
    norm_ptr, eps,
    w_ptr, stride_w, n0, N, K,
    HAS_NORM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    rows = tl.arange(0, BLOCK_R)
    rmask = rows < n_rows
    x_rows = x_ptr + (row0 + rows).to(tl.int64) * stride_x
    ns = n0 + tl.arange(0, BLOCK_N)
    nmask = ns < N
    w_rows = w_ptr + ns.to(tl.int64) * stride_w
    acc = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
    sumsq = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < K
        w = tl.load(w_rows[:, None] + ks[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        x = tl.load(x_rows[:, None] + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        if HAS_NORM:
            sumsq += tl.sum(x * x, axis=1)
            x = x * tl.load(norm_ptr + ks, mask=kmask, other=0.0).to(tl.float32)[None, :]
        if BLOCK_R == 1:
            acc += tl.sum(w.to(tl.float32) * x, axis=1)[None, :]
        elif DOT_FP32:
            acc = tl.dot(x, tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x.to(w.dtype), tl.trans(w), acc)
    if HAS_NORM:
        acc = acc * tl.rsqrt(sumsq / K + eps)[:, None]
    return acc
