"""KDA super-op kernels: ``kda_in_proj`` and ``kda_core`` (twins in program/reference.py).

Tile functions live in ``kda_tiles.py`` (the megakernel calls them directly); this module holds their
generated launchers and the Python ``launch(op, env)`` of each kind.

Grids:  kda_in_proj: ceil(N / BLOCK_N) tiles over the packed W_in rows (N = 3C + G + H + RANK), each
        tile all R rows;  kda_core: B·H tiles, one per (sequence, head), whole fp32 state in registers (heads
        wider than 128: streamed in blocks of key rows, ``state_block_rows``).

GPU design (K3: d 7168, 96 heads of 128, conv 4; bf16 weights):
* kda_in_proj streams W_in (49376 × 7168, 708 MB) once: 772 tiles of 64 rows (0.9 MB each), BLOCK_K
  64 (mma with the rows padded to 16, every row count: ``platform.row_block``), 3-stage
  ``tl.range`` pipeline (the GEMV tile, ``gemv.py``). The input RMSNorm is recomputed per tile from the
  few rows (``gemv.row_inv_rms``, read from L2); the conv epilogue stays in registers (earlier tokens of the step via
  one-hot mma row shifts, older ones from the slot's window) with one CTA barrier between the window
  reads and writes. Bound: 708.7 MB per step -> 212 us at 3.35 TB/s (236 us at 3.0 TB/s).
* kda_core: per (sequence, head) 32 KB of f_b, the 64 KB fp32 state read and written once for all T
  tokens (8 warps: 64 registers per thread hold S), the T-token recurrence and the gated norm in
  registers. 15.9 MB per sequence (12.6 MB of state) -> 4.7 us at 3.35 TB/s.
"""

from __future__ import annotations

import torch
import triton

from nonstop.kernels.kda_tiles import kda_core_tile, kda_in_proj_tile
from nonstop.kernels.launch import launcher, pdl_launch_args
from nonstop.kernels.platform import pipeline_stages, pow2, row_block, upcast_dots

IN_PROJ_BLOCK_N = 64  # W_in rows per tile: 772 tiles of 0.9 MB at K3 size (N = 49376, d = 7168)
# fp32 state values a kda_core tile holds in registers: a head's [128, 128] state (64 a thread at 8 warps);
# wider heads stream their state in blocks of key rows of this size (``state_block_rows``)
STATE_ELEMS = 128 * 128

kda_in_proj_kernel = launcher(kda_in_proj_tile, prefetch=("w_ptr", "pid * BLOCK_N * stride_w", "BLOCK_N * stride_w"))
kda_core_kernel = launcher(kda_core_tile)


def _history(env, state, kind: str) -> tuple:
    """(tensor, slot stride, token stride, KEEP) of the layer's per-token history for a ``keep_states``
    step (speculative verification; ``KDAState.history_for``), else a dummy pointer and KEEP False."""
    if not env.batch.keep_states:
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
    block_n = min(IN_PROJ_BLOCK_N, pow2(N, 16))
    block_r, use_dot = row_block(R)
    block_k = min(64, pow2(d, 16))
    grid = (triton.cdiv(N, block_n),)
    hist = _history(env, state, "conv")
    kda_in_proj_kernel[grid](
        x,
        x.stride(0),
        norm if norm is not None else x,
        a["eps"],
        w,
        w.stride(0),
        conv_w,
        state.conv,
        state.conv.stride(0),
        env.batch.slots,
        env.batch.start,
        *outs,
        R,
        T,
        d,
        C,
        G,
        H,
        RANK,
        K,
        HAS_NORM=norm is not None,
        BLOCK_R=block_r,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        BLOCK_W=pow2(B * (K - 1), 16),
        USE_DOT=use_dot,
        UPCAST=upcast_dots(),
        NUM_STAGES=pipeline_stages(),
        hist_ptr=hist[0],
        stride_hist_slot=hist[1],
        stride_hist_t=hist[2],
        KEEP=hist[3],
        num_warps=4,
        **pdl_launch_args(env),
    )


def state_block_rows(block_d: int) -> int:
    """Key rows of the recurrent state a kda_core tile holds at once: all ``block_d`` (the state stays in
    registers through the sequence's tokens) when [block_d, block_d] fits in ``STATE_ELEMS``, else a block of
    them (the state is streamed through memory, two passes a token)."""
    return min(block_d, max(1, STATE_ELEMS // block_d))


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
    _contiguous(q, k, v, og, beta, fa, fb, out, state, *([gb] if gb is not None else []))
    assert state.dtype == torch.float32 and state.shape[1:] == (H, D, D)
    B, T = env.B, env.T
    lb = a["lower_bound"]
    block_d = pow2(D, 16)
    block_t, use_dot = row_block(T)
    hist = _history(env, layer_state, "recurrent")
    kda_core_kernel[(B * H,)](
        q,
        k,
        v,
        og,
        beta,
        fa,
        fb,
        gb if gb is not None else fb,
        op.weights["A_log"],
        op.weights["dt_bias"],
        op.weights["o_norm"],
        out,
        state,
        state.stride(0),
        env.batch.slots,
        env.batch.start,
        T,
        H,
        D,
        RANK,
        G,
        0.0 if lb is None else float(lb),
        D**-0.5,
        a["eps"],
        BOUNDED=lb is not None,
        LOW_RANK_GATE=gb is not None,
        BLOCK_T=block_t,
        BLOCK_D=block_d,
        BLOCK_RANK=min(64, pow2(RANK, 16)),
        BLOCK_G=min(64, pow2(G, 16)),
        USE_DOT=use_dot,
        UPCAST=upcast_dots(),
        NUM_STAGES=pipeline_stages(),
        hist_ptr=hist[0],
        stride_hist_slot=hist[1],
        stride_hist_t=hist[2],
        KEEP=hist[3],
        BLOCK_KD=state_block_rows(block_d),
        num_warps=8 if block_d >= 128 else 4,
        **pdl_launch_args(env),
    )


def kda_in_proj_refusal(attrs: dict) -> str | None:
    """Why ``kda_in_proj`` cannot run an op with these attrs, or None. Its conv epilogue keeps a window of
    the K-1 >= 1 previous tokens per channel, so K = 1 (no convolution; no published model has it) is left
    to the backends that compute the step in torch."""
    if attrs["conv_size"] < 2:
        return f"kda_in_proj with short_conv_kernel_size {attrs['conv_size']} (the kernel needs >= 2)"
    return None


KERNELS = {"kda_in_proj": kda_in_proj, "kda_core": kda_core}
REFUSALS = {"kda_in_proj": kda_in_proj_refusal}
