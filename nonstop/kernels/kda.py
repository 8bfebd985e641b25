"""KDA super-op kernels: ``kda_in_proj`` and ``kda_core`` (twins in program/reference.py).

Tile functions live in ``kda_tiles.py`` (the megakernel calls them directly); this module holds the
one-program-per-tile launchers and the Python ``launch(op, env)`` of each kind.

Grids:  kda_in_proj: ceil(N / BLOCK_N) tiles over the packed W_in rows (N = 3C + G + H + RANK), each
        tile all R rows;  kda_core: B·H tiles, one per (sequence, head), whole fp32 state in registers.

GPU design (K3: d 7168, 96 heads of 128, conv 4; bf16 weights):
* kda_in_proj streams W_in (49376 × 7168, 708 MB) once: 772 tiles of 64 rows (0.9 MB each), BLOCK_K
  128 (R = 1: fp32 FMA + reduction) or 64 (R >= 2: mma with the rows padded to 16), 3-stage
  ``tl.range`` pipeline. The input RMSNorm is folded into the same pass (per-row sum of squares,
  applied to the accumulator); the conv epilogue stays in registers (earlier tokens of the step via
  one-hot mma row shifts, older ones from the slot's window) with one CTA barrier between the window
  reads and writes. Bound: 708.7 MB per step -> 212 us at 3.35 TB/s (236 us at 3.0 TB/s).
* kda_core: per (sequence, head) 32 KB of f_b, the 64 KB fp32 state read and written once for all T
  tokens (8 warps: 64 registers per thread hold S), the T-token recurrence and the gated norm in
  registers. 15.9 MB per sequence (12.6 MB of state) -> 4.7 us at 3.35 TB/s.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from nonstop.kernels.kda_tiles import kda_core_tile, kda_in_proj_tile
from nonstop.kernels.pdl import pdl_launch_args, pdl_wait
from nonstop.kernels.rows_gemv import row_block

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"

IN_PROJ_BLOCK_N = 64  # W_in rows per tile: 772 tiles of 0.9 MB at K3 size (N = 49376, d = 7168)
NUM_STAGES = 3


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(n))


def _dot_fp32(dtype: torch.dtype) -> bool:
    """Upcast tl.dot operands to fp32 (ieee): always in the interpreter (its bf16 dot is wrong), and for fp32 models."""
    return INTERPRETING or dtype == torch.float32


@triton.jit
def _kda_in_proj_kernel(
    x_ptr, stride_x, norm_ptr, eps, w_ptr, stride_w, conv_w_ptr, win_ptr, stride_win_slot, slots_ptr, start_ptr,
    q_ptr, k_ptr, v_ptr, og_ptr, beta_ptr, fa_ptr, R, T, d, C, G, H, RANK, K,
    HAS_NORM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_W: tl.constexpr, DOT_FP32: tl.constexpr, NUM_STAGES: tl.constexpr,
    hist_ptr, stride_hist_slot, stride_hist_t, KEEP: tl.constexpr, USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    kda_in_proj_tile(tl.program_id(0), x_ptr, stride_x, norm_ptr, eps, w_ptr, stride_w, conv_w_ptr, win_ptr, stride_win_slot,
                     slots_ptr, start_ptr, q_ptr, k_ptr, v_ptr, og_ptr, beta_ptr, fa_ptr, R, T, d, C, G, H, RANK, K,
                     HAS_NORM, BLOCK_R, BLOCK_N, BLOCK_K, BLOCK_W, DOT_FP32, NUM_STAGES,
                     hist_ptr, stride_hist_slot, stride_hist_t, KEEP)


@triton.jit
def _kda_core_kernel(
    q_ptr, k_ptr, v_ptr, og_ptr, beta_ptr, fa_ptr, fb_ptr, gb_ptr, A_log_ptr, dt_bias_ptr, o_norm_ptr,
    out_ptr, state_ptr, stride_state_slot, slots_ptr, start_ptr, T, H, D, RANK, G, lower_bound, q_scale, eps,
    BOUNDED: tl.constexpr, LOW_RANK_GATE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_RANK: tl.constexpr, BLOCK_G: tl.constexpr, DOT_FP32: tl.constexpr, NUM_STAGES: tl.constexpr,
    hist_ptr, stride_hist_slot, stride_hist_t, KEEP: tl.constexpr, USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    kda_core_tile(tl.program_id(0), q_ptr, k_ptr, v_ptr, og_ptr, beta_ptr, fa_ptr, fb_ptr, gb_ptr, A_log_ptr, dt_bias_ptr,
                  o_norm_ptr, out_ptr, state_ptr, stride_state_slot, slots_ptr, start_ptr, T, H, D, RANK, G, lower_bound,
                  q_scale, eps, BOUNDED, LOW_RANK_GATE, BLOCK_T, BLOCK_D, BLOCK_RANK, BLOCK_G, DOT_FP32, NUM_STAGES,
                  hist_ptr, stride_hist_slot, stride_hist_t, KEEP)


def _history(env, state, kind: str) -> tuple:
    """(tensor, slot stride, token stride, KEEP) of the layer's per-token history for a ``keep_states``
    step (speculative verification; ``KDAState.history_for``), else a dummy pointer and KEEP False."""
    if not getattr(env.batch, "keep_states", False):
        held = state.recurrent if kind == "recurrent" else state.conv
        return held, 0, 0, False
    hist = state.history_for(kind, env.batch.slots, env.T)
    return hist, hist.stride(0), hist.stride(1), True


def _contiguous(*tensors: torch.Tensor) -> None:
    for t in tensors:
        assert t.is_contiguous(), "KDA kernels expect contiguous buffers and weights"


def kda_in_proj(op, env) -> None:
    """Triton kda_in_proj: one launch, ceil(N / BLOCK_N) tiles."""
    a = op.attrs
    x = env.buf[op.reads[0]]
    outs = [env.buf[name] for name in op.writes]
    w, conv_w = op.weights["w_in"], op.weights["conv"]
    norm = op.weights.get("norm")
    state = env.cache.layers[a["cache_layer"]]
    C, K = a["channels"], a["conv_size"]
    _, _, _, G, H, RANK = a["in_sizes"]
    R, d = x.shape
    B, T = env.B, env.T
    N = w.shape[0]
    assert K >= 2 and R <= 16 and N == 3 * C + G + H + RANK
    _contiguous(w, conv_w, state.conv, *outs)
    assert x.stride(1) == 1 and w.dtype == x.dtype == outs[0].dtype == state.conv.dtype
    block_n = min(IN_PROJ_BLOCK_N, _pow2(N))
    block_r = row_block(R)
    block_k = min(128 if block_r == 1 else 64, _pow2(d))
    grid = (triton.cdiv(N, block_n),)
    hist = _history(env, state, "conv")
    _kda_in_proj_kernel[grid](
        x, x.stride(0), norm if norm is not None else x, a["eps"], w, w.stride(0), conv_w,
        state.conv, state.conv.stride(0), env.batch.slots, env.batch.start, *outs,
        R, T, d, C, G, H, RANK, K,
        HAS_NORM=norm is not None, BLOCK_R=block_r, BLOCK_N=block_n, BLOCK_K=block_k,
        BLOCK_W=_pow2(B * (K - 1)), DOT_FP32=_dot_fp32(x.dtype), NUM_STAGES=NUM_STAGES,
        hist_ptr=hist[0], stride_hist_slot=hist[1], stride_hist_t=hist[2], KEEP=hist[3], num_warps=4, **pdl_launch_args(env),
    )


def kda_core(op, env) -> None:
    """Triton kda_core: one launch, B·H tiles (sequence, head)."""
    a = op.attrs
    q, k, v, og, beta, fa = (env.buf[name] for name in op.reads)
    out = env.buf[op.writes[0]]
    fb, gb = op.weights["f_b"], op.weights.get("g_b")
    layer_state = env.cache.layers[a["cache_layer"]]
    state = layer_state.recurrent
    H, D = a["heads"], a["head_dim"]
    RANK, G = fa.shape[1], og.shape[1]
    _contiguous(q, k, v, og, beta, fa, fb, out, state, *( [gb] if gb is not None else []))
    assert state.dtype == torch.float32 and state.shape[1:] == (H, D, D)
    B, T = env.B, env.T
    lb = a["lower_bound"]
    block_d = _pow2(D)
    hist = _history(env, layer_state, "recurrent")
    _kda_core_kernel[(B * H,)](
        q, k, v, og, beta, fa, fb, gb if gb is not None else fb, op.weights["A_log"], op.weights["dt_bias"], op.weights["o_norm"],
        out, state, state.stride(0), env.batch.slots, env.batch.start, T, H, D, RANK, G,
        0.0 if lb is None else float(lb), D**-0.5, a["eps"],
        BOUNDED=lb is not None, LOW_RANK_GATE=gb is not None, BLOCK_T=row_block(T), BLOCK_D=block_d,
        BLOCK_RANK=min(64, _pow2(RANK)), BLOCK_G=min(64, _pow2(G)), DOT_FP32=_dot_fp32(q.dtype), NUM_STAGES=NUM_STAGES,
        hist_ptr=hist[0], stride_hist_slot=hist[1], stride_hist_t=hist[2], KEEP=hist[3],
        num_warps=8 if block_d >= 128 else 4, **pdl_launch_args(env),
    )


KERNELS = {"kda_in_proj": kda_in_proj, "kda_core": kda_core}
