"""K3's attention-residual mix + RMSNorm (``attnres_mix_norm``; twin in ``nonstop/program/reference.py``).

Per row, over the sources v_0..v_n = blocks[row, :n] and partial[row] (n = n_blocks; d = D values each):

    logit_s = ⟨w, v_s⟩ · 1/sqrt(mean v_s² + eps)          mix = (Σ_s softmax(logit)_s v_s).to(DT)
    out = RMSNorm(mix) = (γ ⊙ (mix · 1/sqrt(mean mix² + eps)).to(DT)).to(DT)       blocks[row, store] = partial[row]

(``model/attnres.py``; DT the model dtype). A row's work is spread over its column chunks (BLOCK_C columns,
NCH = cdiv(D, BLOCK_C) chunks a row) in three phases (``launch.py``'s protocol), tile t = (row, chunk) =
divmod(t, NCH) in each:
  1 ``dots``  the chunk's ⟨w, v_s⟩ and Σ v_s² of every source, all sources loaded at once ([BLOCK_S, BLOCK_C],
              BLOCK_S >= n + 1) -> ``attnres.dots`` [R, NCH, 2·BLOCK_S]; the store of the chunk's partial
  2 ``mix``   the row's logits from all its chunks' sums (``gemv.rms_factor``, the one RMS helper), the softmax,
              the chunk's mix (rounded to DT) -> out, its Σ mix² -> ``attnres.sq`` [R, NCH]
  3 ``norm``  the row's RMS from its chunks' Σ mix², out's chunk normalised in place (``gemv.rms_scale``)
Every value has one writer and fixed summation orders: the result does not depend on scheduling.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nonstop.kernels.gemv import rms_factor, rms_scale
from nonstop.kernels.launch import launcher, pdl_launch_args, phase_counters, phase_done, phase_ticket, workspace
from nonstop.kernels.platform import interpreting, pow2

BLOCK_C = 512  # columns of a row per tile on a GPU: K3's 7168 in 14 tiles a row, [16 sources, 512] a load


@triton.jit
def _sources(
    blocks_ptr,
    stride_blk_row,
    stride_blk_src,
    partial_ptr,
    stride_partial,
    row,
    cols,
    D,
    n_blocks,
    BLOCK_S: tl.constexpr,
):
    """The chunk ``cols`` of every source of ``row``: [BLOCK_S, BLOCK_C] fp32 (rows > n_blocks zero)."""
    s = tl.arange(0, BLOCK_S)
    base = tl.where(
        s < n_blocks,
        blocks_ptr + row.to(tl.int64) * stride_blk_row + s.to(tl.int64) * stride_blk_src,
        partial_ptr + row.to(tl.int64) * stride_partial,
    )
    mask = (s <= n_blocks)[:, None] & (cols < D)[None, :]
    return tl.load(base[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _dots(
    blocks_ptr,
    stride_blk_row,
    stride_blk_src,
    partial_ptr,
    stride_partial,
    query_ptr,
    dots_ptr,
    row,
    c,
    D,
    NCH,
    n_blocks,
    store_block,
    HAS_STORE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Phase 1 of tile (row, c): the chunk's ⟨w, v_s⟩ and Σ v_s² -> the tile's cell; the block store's chunk."""
    cols = c * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < D
    s = tl.arange(0, BLOCK_S)
    v = _sources(
        blocks_ptr, stride_blk_row, stride_blk_src, partial_ptr, stride_partial, row, cols, D, n_blocks, BLOCK_S
    )
    w = tl.load(query_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    cell = dots_ptr + (row.to(tl.int64) * NCH + c) * (2 * BLOCK_S)
    tl.store(cell + s, tl.sum(v * w[None, :], axis=1))
    tl.store(cell + BLOCK_S + s, tl.sum(v * v, axis=1))
    if HAS_STORE:
        chunk = tl.load(partial_ptr + row.to(tl.int64) * stride_partial + cols, mask=cmask, other=0.0)
        dest = blocks_ptr + row.to(tl.int64) * stride_blk_row + store_block * stride_blk_src
        tl.store(dest + cols, chunk, mask=cmask)


@triton.jit
def _mix(
    blocks_ptr,
    stride_blk_row,
    stride_blk_src,
    partial_ptr,
    stride_partial,
    out_ptr,
    stride_out,
    dots_ptr,
    sq_ptr,
    row,
    c,
    D,
    NCH,
    n_blocks,
    eps,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_NCH: tl.constexpr,
):
    """Phase 2 of tile (row, c): the row's logits from all its cells, the chunk's mix -> out, Σ mix² -> sq."""
    cols = c * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < D
    s = tl.arange(0, BLOCK_S)
    ch = tl.arange(0, BLOCK_NCH)
    cells = dots_ptr + (row.to(tl.int64) * NCH + ch[:, None]) * (2 * BLOCK_S) + s[None, :]
    cm = (ch < NCH)[:, None]
    dot = tl.sum(tl.load(cells, mask=cm, other=0.0), axis=0)  # [BLOCK_S]: the chunks summed in order
    sum_sq = tl.sum(tl.load(cells + BLOCK_S, mask=cm, other=0.0), axis=0)
    logit = tl.where(s <= n_blocks, dot * rms_factor(sum_sq, D, eps), float("-inf"))
    p = tl.exp(logit - tl.max(logit, axis=0))
    alpha = p / tl.sum(p, axis=0)
    v = _sources(
        blocks_ptr, stride_blk_row, stride_blk_src, partial_ptr, stride_partial, row, cols, D, n_blocks, BLOCK_S
    )
    mix = tl.sum(alpha[:, None] * v, axis=0).to(partial_ptr.dtype.element_ty)
    tl.store(out_ptr + row.to(tl.int64) * stride_out + cols, mix.to(out_ptr.dtype.element_ty), mask=cmask)
    m = tl.where(cmask, mix.to(tl.float32), 0.0)
    tl.store(sq_ptr + row.to(tl.int64) * NCH + c, tl.sum(m * m, axis=0))


@triton.jit
def _norm(
    norm_ptr,
    out_ptr,
    stride_out,
    sq_ptr,
    row,
    c,
    D,
    NCH,
    eps,
    DT: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_NCH: tl.constexpr,
):
    """Phase 3 of tile (row, c): out's chunk normalised in place with the row's Σ mix² (its chunks summed)."""
    cols = c * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < D
    ch = tl.arange(0, BLOCK_NCH)
    total = tl.sum(tl.load(sq_ptr + row.to(tl.int64) * NCH + ch, mask=ch < NCH, other=0.0), axis=0)
    row_out = out_ptr + row.to(tl.int64) * stride_out
    mix = tl.load(row_out + cols, mask=cmask, other=0.0)
    gamma = tl.load(norm_ptr + cols, mask=cmask, other=0.0)
    normed = rms_scale(mix, rms_factor(total, D, eps), gamma, DT)
    tl.store(row_out + cols, normed.to(out_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def attnres_tile(
    tile,
    counters_ptr,
    n_tiles,
    blocks_ptr,
    stride_blk_row,
    stride_blk_src,
    partial_ptr,
    stride_partial,
    query_ptr,
    norm_ptr,
    out_ptr,
    stride_out,
    dots_ptr,
    sq_ptr,
    D,
    NCH,
    n_blocks,
    store_block,
    eps,
    HAS_STORE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_NCH: tl.constexpr,
    PHASE: tl.constexpr,
):
    """One tile of the mix (module docstring): PHASE 1 ``dots``, 2 ``mix``, 3 ``norm`` (n_tiles = R·NCH tiles
    each); 0 the in-launch protocol (counters int32 [4] zeros). blocks [R, NB, D] (row / source strides),
    partial [R, D], out [R, D] (unit column strides); query w, norm γ [D]; dots fp32 [R, NCH, 2·BLOCK_S],
    sq fp32 [R, NCH]."""
    phase = PHASE
    if PHASE == 0:
        phase, tile = phase_ticket(counters_ptr, n_tiles, n_tiles)
    row = tile // NCH
    c = tile % NCH
    if phase == 1:
        _dots(
            blocks_ptr,
            stride_blk_row,
            stride_blk_src,
            partial_ptr,
            stride_partial,
            query_ptr,
            dots_ptr,
            row,
            c,
            D,
            NCH,
            n_blocks,
            store_block,
            HAS_STORE,
            BLOCK_S,
            BLOCK_C,
        )
    elif phase == 2:
        _mix(
            blocks_ptr,
            stride_blk_row,
            stride_blk_src,
            partial_ptr,
            stride_partial,
            out_ptr,
            stride_out,
            dots_ptr,
            sq_ptr,
            row,
            c,
            D,
            NCH,
            n_blocks,
            eps,
            BLOCK_S,
            BLOCK_C,
            BLOCK_NCH,
        )
    else:
        _norm(
            norm_ptr, out_ptr, stride_out, sq_ptr, row, c, D, NCH, eps, partial_ptr.dtype.element_ty, BLOCK_C, BLOCK_NCH
        )
    if PHASE == 0:
        phase_done(counters_ptr, phase, n_tiles, 3)


attnres_kernel = launcher(attnres_tile, phases=("dots", "mix", "norm"), first=("n_tiles", "n_tiles"))


def attnres_blocks(D: int, sources: int) -> dict:
    """Constexpr blocks of ``attnres_tile`` for rows of D values and up to ``sources`` sources: BLOCK_C columns
    a tile (``BLOCK_C`` on a GPU; half a (padded) row in the interpreter: a few tiles a row, big numpy
    steps), BLOCK_S >= sources."""
    block_c = max(16, pow2(D) // 2) if interpreting() else min(BLOCK_C, pow2(D, 16))
    return dict(BLOCK_S=pow2(sources), BLOCK_C=block_c, BLOCK_NCH=pow2(triton.cdiv(D, block_c)))


def attnres_mix_norm(op, env):
    """x = RMSNorm(Mix(blocks[:n] + [partial])); blocks[store] = partial (see ``model/attnres.py``): one launch
    of 3·R·NCH tiles."""
    blocks, partial, out = env.buf["blocks"], env.buf["partial"], env.buf[op.writes[0]]
    R, NB, D = blocks.shape
    assert blocks.stride(2) == 1 and partial.stride(1) == 1 and out.stride(1) == 1
    store = op.attrs.get("store_block")
    cfg = attnres_blocks(D, NB + 1)  # every op of the model one class: sized for the most sources
    nch = triton.cdiv(D, cfg["BLOCK_C"])
    dots = workspace("attnres.dots", R * nch * 2 * cfg["BLOCK_S"], torch.float32, blocks.device)
    sq = workspace("attnres.sq", R * nch, torch.float32, blocks.device)
    attnres_kernel[(3 * R * nch,)](
        phase_counters("attnres", blocks.device),
        R * nch,
        blocks,
        blocks.stride(0),
        blocks.stride(1),
        partial,
        partial.stride(0),
        op.weights["query"],
        op.weights["norm"],
        out,
        out.stride(0),
        dots,
        sq,
        D,
        nch,
        op.attrs["n_blocks"],
        store if store is not None else 0,
        op.attrs["eps"],
        HAS_STORE=store is not None,
        **cfg,
        num_warps=8,
        **pdl_launch_args(env),
    )


KERNELS = {"attnres_mix_norm": attnres_mix_norm}
