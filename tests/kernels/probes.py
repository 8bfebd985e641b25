"""Test-only kernels: small launches that expose the kernels' building blocks (the GEMV tile, MXFP4
decoding, the gated activations, in-kernel expert selection) to comparisons with torch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nonstop.kernels.activations import act_code, glu_tile
from nonstop.kernels.gemv import gemv_rows, mxfp4_decode, row_inv_rms
from nonstop.kernels.moe_routing import route_summary, routing_blocks, slot_expert
from nonstop.kernels.platform import pow2, row_block, upcast_dots

# ----------------------------------------------------------------------------- the GEMV tile


@triton.jit
def _gemv_probe(
    x_ptr,
    norm_ptr,
    wa_ptr,
    wb_ptr,
    sa_ptr,
    sb_ptr,
    stride_w,
    stride_s,
    KB,
    rows_ptr,
    rows_b_ptr,
    out_ptr,
    R,
    K,
    N,
    eps,
    HAS_NORM: tl.constexpr,
    PAIR: tl.constexpr,
    MXFP4: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    DT: tl.constexpr = x_ptr.dtype.element_ty
    n = tl.arange(0, BLOCK_N)
    nmask = n < N
    rows = tl.load(rows_ptr + n, mask=nmask, other=0)
    rows_b = tl.load(rows_b_ptr + n, mask=nmask, other=0)
    if HAS_NORM:
        inv_rms = row_inv_rms(x_ptr, K, R, K, eps, DT, BLOCK_R, BLOCK_K)
    else:
        inv_rms = tl.full([BLOCK_R], 1.0, tl.float32)
    a, b = gemv_rows(
        x_ptr,
        K,
        R,
        0,
        K,
        norm_ptr,
        inv_rms,
        wa_ptr,
        wb_ptr,
        stride_w,
        sa_ptr,
        sb_ptr,
        stride_s,
        KB,
        rows,
        rows_b,
        nmask,
        HAS_NORM,
        PAIR,
        MXFP4,
        DT,
        BLOCK_R,
        BLOCK_K,
        USE_DOT,
        UPCAST,
        1,
    )
    r = tl.arange(0, BLOCK_R)
    mask = (r < R)[:, None] & nmask[None, :]
    tl.store(out_ptr + r[:, None] * N + n[None, :], a, mask=mask)
    tl.store(out_ptr + BLOCK_R * N + r[:, None] * N + n[None, :], b, mask=mask)


def gemv(x, wa, rows, *, wb=None, rows_b=None, scales=None, scales_b=None, norm=None, eps=1e-5, block_k=32):
    """(x̂ W_a[rows]ᵀ, x̂ W_b[rows_b]ᵀ) through ``gemv_rows``: x [R, K]; dense w [*, K] or (``scales`` given)
    MXFP4 packed bytes [*, ceil(K/2)] with scales [*, ceil(K/32)].
    Returns fp32 [R, N] (and the pair)."""
    R, K = x.shape
    N = rows.numel()
    BR, dot = row_block(R)
    pair = wb is not None
    wb = wa if wb is None else wb
    rows_b = rows if rows_b is None else rows_b
    mx = scales is not None
    sa = scales if mx else wa
    sb = (scales_b if scales_b is not None else sa) if mx else wa
    out = torch.full((2, BR, N), float("nan"))
    _gemv_probe[(1,)](
        x,
        norm if norm is not None else x,
        wa,
        wb,
        sa,
        sb,
        wa.stride(0),
        sa.stride(0),
        wa.shape[1] if mx else 0,
        rows.to(torch.int32),
        rows_b.to(torch.int32),
        out,
        R,
        K,
        N,
        eps,
        HAS_NORM=norm is not None,
        PAIR=pair,
        MXFP4=mx,
        BLOCK_R=BR,
        BLOCK_N=pow2(N, 16),
        BLOCK_K=block_k,
        USE_DOT=dot,
        UPCAST=upcast_dots(),
    )
    return out[0, :R], out[1, :R]


# ----------------------------------------------------------------------------- MXFP4, activations


@triton.jit
def _mxfp4_probe(b_ptr, s_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    m = i < n
    even, odd = mxfp4_decode(tl.load(b_ptr + i, mask=m, other=0), tl.load(s_ptr + i, mask=m, other=127), tl.float32)
    tl.store(out_ptr + 2 * i, even, mask=m)
    tl.store(out_ptr + 2 * i + 1, odd, mask=m)


def mxfp4_values(packed: torch.Tensor, scale_per_byte: torch.Tensor) -> torch.Tensor:
    """fp32 values of flat packed bytes [n] with the scale exponent of each byte [n] -> [2n]."""
    n = packed.numel()
    out = torch.empty(2 * n)
    _mxfp4_probe[(1,)](packed.contiguous(), scale_per_byte.contiguous(), out, n, BLOCK=pow2(n, 16))
    return out


@triton.jit
def _glu_probe(g_ptr, u_ptr, out_ptr, n, beta, linear_beta, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, glu_tile(g, u, ACT, beta, linear_beta, tl.float32), mask=m)


def gated_activation(
    gate: torch.Tensor, up: torch.Tensor, act: str, beta: float = 4.0, linear_beta: float = 25.0
) -> torch.Tensor:
    """fp32 act(gate, up) of flat tensors through ``glu_tile``."""
    g, u = gate.reshape(-1).contiguous(), up.reshape(-1).contiguous()
    out = torch.empty(g.shape, dtype=torch.float32)
    _glu_probe[(triton.cdiv(g.numel(), 256),)](g, u, out, g.numel(), beta, linear_beta, ACT=act_code(act), BLOCK=256)
    return out.view(gate.shape)


# ----------------------------------------------------------------------------- expert selection


@triton.jit
def _route_probe(
    logits_ptr,
    stride_l,
    bias_ptr,
    out_ids_ptr,
    out_p_ptr,
    R,
    E,
    EG,
    top_k,
    topk_groups,
    scaling,
    SOFTMAX: tl.constexpr,
    RENORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GROUPED: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_EG: tl.constexpr,
    BLOCK_TOPK: tl.constexpr,
):
    """Program ``slot``: out_ids[slot] = its expert (-1 if none), out_p[slot, r] = row r's weight for it."""
    slot = tl.program_id(0)
    present, ids, sel_id, sel_w = route_summary(
        logits_ptr,
        stride_l,
        bias_ptr,
        R,
        E,
        EG,
        top_k,
        topk_groups,
        scaling,
        SOFTMAX,
        RENORM,
        HAS_BIAS,
        GROUPED,
        BLOCK_R,
        BLOCK_G,
        BLOCK_EG,
        BLOCK_TOPK,
    )
    expert, p_rows = slot_expert(present, ids, sel_id, sel_w, slot)
    found = slot < tl.sum(present, axis=0)
    tl.store(out_ids_ptr + slot, tl.where(found, expert, -1))
    r = tl.arange(0, BLOCK_R)
    tl.store(out_p_ptr + slot * BLOCK_R + r, tl.where(found, p_rows, 0.0))


def route_slots(logits, bias, cfg):
    """(expert id per slot [min(E, R·k)] (-1 = none), weight per (slot, row) [slots, R])."""
    R, E = logits.shape
    blocks = routing_blocks(R, E, cfg.num_groups, cfg.top_k)
    slots = min(E, R * cfg.top_k)
    out_ids = torch.empty(slots, dtype=torch.int32)
    out_p = torch.empty(slots, blocks["BLOCK_R"], dtype=torch.float32)
    _route_probe[(slots,)](
        logits,
        logits.stride(0),
        bias if bias is not None else logits,
        out_ids,
        out_p,
        R,
        E,
        E // cfg.num_groups,
        cfg.top_k,
        cfg.topk_groups,
        cfg.routed_scaling_factor,
        SOFTMAX=cfg.scoring == "softmax",
        RENORM=cfg.renormalize,
        HAS_BIAS=bias is not None,
        GROUPED=cfg.num_groups > 1,
        **blocks,
    )
    return out_ids, out_p[:, :R]
