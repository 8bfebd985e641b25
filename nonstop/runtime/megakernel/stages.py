"""Task stages of the recorded launchers: which tile body a megakernel task calls, and how many tiles.

Most launchers are one stage: ``tile_fn(tl.program_id(0), ...)`` over their grid. ``codegen`` turns the
launcher's own source into a stage body ``(tile, ntiles, <launcher parameters>)`` by replacing
``tl.program_id(0)`` with ``tile`` and ``tl.num_programs(0)`` with ``ntiles``.

Three launchers run two phases inside one launch, ordered by their own in-kernel counters (tickets or
last-arriver): the dense MLP (h chunks, then the down GEMV), GQA and MLA split-KV attention (split
tiles, then the merge). In the megakernel each phase is a stage of its own, ordered by the schedule's
counters; the bodies below take the launcher's parameters (so the same recorded arguments feed
them) and call the phase's tile function. Their in-kernel counters are not touched. The launchers'
``USE_PDL`` is recorded False (the megakernel's tasks are ordered by its own counters) and unused here.

``STAGES[launcher name] = [(stage name, body, ntiles(args, grid))]``; a missing name means the
generic one-stage body.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nonstop.kernels.common import gemv_tile, mlp_act_tile
from nonstop.kernels.gqa import gqa_attn_combine_tile, gqa_attn_split_tile
from nonstop.kernels.mla import mla_attn_combine_tile, mla_attn_split_tile


# ----------------------------------------------------------------------------- dense MLP (common._mlp_kernel)


@triton.jit
def mlp_gate_up(tile, ntiles, x_ptr, stride_x, norm_ptr, eps, wg_ptr, wu_ptr, stride_wgu, bg_ptr, bu_ptr, wd_ptr, stride_wd, bd_ptr,
                target_ptr, stride_t, h_ptr, stride_h, count_ptr, num_chunks, num_down_tiles, R, D, I, beta, linear_beta,
                HAS_NORM: tl.constexpr, HAS_GU_BIAS: tl.constexpr, HAS_DOWN_BIAS: tl.constexpr, ACT: tl.constexpr,
                EPILOGUE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_KD: tl.constexpr, USE_DOT: tl.constexpr, UPCAST: tl.constexpr,
                NUM_STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    """h[:, tile·BLOCK_I ..] = glu(gate, up) of the normalised input (``mlp_act_tile``)."""
    mlp_act_tile(tile, x_ptr, stride_x, norm_ptr, eps, wg_ptr, wu_ptr, stride_wgu, bg_ptr, bu_ptr, h_ptr, stride_h,
                 R, D, I, beta, linear_beta, HAS_NORM, HAS_GU_BIAS, ACT, BLOCK_R, BLOCK_I, BLOCK_K, USE_DOT, UPCAST)


@triton.jit
def mlp_down(tile, ntiles, x_ptr, stride_x, norm_ptr, eps, wg_ptr, wu_ptr, stride_wgu, bg_ptr, bu_ptr, wd_ptr, stride_wd, bd_ptr,
             target_ptr, stride_t, h_ptr, stride_h, count_ptr, num_chunks, num_down_tiles, R, D, I, beta, linear_beta,
             HAS_NORM: tl.constexpr, HAS_GU_BIAS: tl.constexpr, HAS_DOWN_BIAS: tl.constexpr, ACT: tl.constexpr,
             EPILOGUE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_KD: tl.constexpr, USE_DOT: tl.constexpr, UPCAST: tl.constexpr,
             NUM_STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    """target[:, tile·BLOCK_N ..] (+)= W_down h (+ b_d) (``gemv_tile``, the residual epilogue)."""
    gemv_tile(tile, h_ptr, stride_h, norm_ptr, eps, wd_ptr, stride_wd, bd_ptr, target_ptr, stride_t, R, D, I,
              False, HAS_DOWN_BIAS, EPILOGUE, True, 1, BLOCK_R, BLOCK_N, BLOCK_KD, USE_DOT, UPCAST, NUM_STAGES)


# ----------------------------------------------------------------------------- GQA attention (gqa._gqa_attn_kernel)


@triton.jit
def gqa_split(tile, ntiles, counters_ptr, q_ptr, k_ptr, v_ptr, kv_stride, slots_ptr, start_ptr, table_ptr, table_stride, PAGE_SIZE: tl.constexpr,
              ml_ptr, acc_ptr, out_ptr, T, H, HKV, D, scale, SPLIT, NS, MB,
              BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
              NUM_STAGES: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr, USE_PDL: tl.constexpr):
    """Split tile ``tile`` = ((b, g, mb), s): partial (max, sum, Σ p·v) of its keys."""
    gqa_attn_split_tile(tile, q_ptr, k_ptr, v_ptr, kv_stride, slots_ptr, start_ptr, table_ptr, table_stride, PAGE_SIZE,
                        ml_ptr, acc_ptr, out_ptr, T, H, HKV, D, scale, SPLIT, NS, MB,
                        BLOCK_M, BLOCK_S, BLOCK_D, NUM_STAGES, DOT_F32, PREC)


@triton.jit
def gqa_combine(tile, ntiles, counters_ptr, q_ptr, k_ptr, v_ptr, kv_stride, slots_ptr, start_ptr, table_ptr, table_stride, PAGE_SIZE: tl.constexpr,
                ml_ptr, acc_ptr, out_ptr, T, H, HKV, D, scale, SPLIT, NS, MB,
                BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
                NUM_STAGES: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr, USE_PDL: tl.constexpr):
    """Merge tile ``tile`` = (b, g, mb): the valid splits of its query items into out. A sequence whose
    keys fit one split was written by its split-0 tile (``gqa_attn_split_tile``): nothing to merge."""
    b = tile // (HKV * MB)
    if tl.load(start_ptr + b).to(tl.int32) + T > SPLIT:
        gqa_attn_combine_tile(tile, ml_ptr, acc_ptr, start_ptr, out_ptr, T, H, HKV, D, SPLIT, NS, MB, BLOCK_M, BLOCK_D)


# ----------------------------------------------------------------------------- MLA attention (mla._mla_attn_kernel)


@triton.jit
def mla_split(tile, ntiles, counters_ptr, n_split_tiles, n_combine_tiles,
              q_lat_ptr, q_pe_ptr, latent_ptr, latent_stride, slots_ptr, start_ptr, table_ptr, table_stride, PAGE_SIZE: tl.constexpr,
              ml_ptr, acc_ptr, w_uv_ptr, uv_head_stride, uv_row_stride, gate_ptr, gate_stride, out_ptr, out_stride,
              R, T, N, RR, L, V, scale, SPLIT, NS, MB,
              GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_L: tl.constexpr,
              BLOCK_RR: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
              NUM_STAGES: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr, USE_PDL: tl.constexpr):
    """Split tile ``tile`` = (b, mb, s) of absorbed latent attention."""
    mla_attn_split_tile(tile, q_lat_ptr, q_pe_ptr, latent_ptr, latent_stride, slots_ptr, start_ptr, table_ptr, table_stride, PAGE_SIZE,
                        ml_ptr, acc_ptr, T, N, RR, L, scale, SPLIT, NS, MB,
                        BLOCK_M, BLOCK_S, BLOCK_L, BLOCK_RR, NUM_STAGES, DOT_F32, PREC)


@triton.jit
def mla_combine(tile, ntiles, counters_ptr, n_split_tiles, n_combine_tiles,
                q_lat_ptr, q_pe_ptr, latent_ptr, latent_stride, slots_ptr, start_ptr, table_ptr, table_stride, PAGE_SIZE: tl.constexpr,
                ml_ptr, acc_ptr, w_uv_ptr, uv_head_stride, uv_row_stride, gate_ptr, gate_stride, out_ptr, out_stride,
                R, T, N, RR, L, V, scale, SPLIT, NS, MB,
                GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_L: tl.constexpr,
                BLOCK_RR: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
                NUM_STAGES: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr, USE_PDL: tl.constexpr):
    """Merge tile ``tile`` = head h: merge the splits, W_UV[h], output gate."""
    mla_attn_combine_tile(tile, ml_ptr, acc_ptr, start_ptr, w_uv_ptr, uv_head_stride, uv_row_stride,
                          gate_ptr, gate_stride, out_ptr, out_stride, R, T, N, L, V, SPLIT, NS,
                          GATED, BLOCK_R, BLOCK_L, BLOCK_V, DOT_F32, PREC)


STAGES = {
    "_mlp_kernel": [("gate_up", mlp_gate_up, lambda a, grid: a["num_chunks"]), ("down", mlp_down, lambda a, grid: a["num_down_tiles"])],
    "_gqa_attn_kernel": [("split", gqa_split, lambda a, grid: grid), ("combine", gqa_combine, lambda a, grid: grid // a["NS"])],
    "_mla_attn_kernel": [("split", mla_split, lambda a, grid: a["n_split_tiles"]), ("combine", mla_combine, lambda a, grid: a["n_combine_tiles"])],
}
