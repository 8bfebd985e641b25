"""Triton building blocks of the MoE super-ops: gated activations, MXFP4 decoding, GEMV contractions,
RMSNorm of rows. All are ``@triton.jit`` device functions (inlined into the tile functions of
``nonstop/kernels/moe.py``), plus two tiny test kernels that expose the decoders to unit tests.

Conventions: a "row block" holds the R <= 16 activation rows of a step, ``[BLOCK_R, ...]``; weights are
row-major ``[N, K]`` with unit column stride; every accumulation is fp32. Where the plain-torch twin
rounds an intermediate to the model dtype (``DT``), the helpers round at the same point, so kernel and
twin differ only by summation order.

MXFP4 (``nonstop/weights/mxfp4.py``): byte j of a row holds the E2M1 codes of elements 2j (low nibble)
and 2j+1 (high nibble); ``scale[k // 32]`` is an E8M0 exponent s, factor 2^(s-127) (s = 255: NaN).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# ----------------------------------------------------------------------------- activations


@triton.jit
def soft_cap(y, cap):
    """cap · tanh(y / cap), fp32, without libdevice: odd Taylor series below |t| = 0.1 (where
    1 - e^{-2|t|} would cancel), (1 - e^{-2|t|}) / (1 + e^{-2|t|}) above."""
    t = y / cap
    a = tl.abs(t)
    e = tl.exp(-2.0 * a)
    big = (1.0 - e) / (1.0 + e)
    a2 = a * a
    small = a * (1.0 + a2 * (-1.0 / 3.0 + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0))))
    th = tl.where(a < 0.1, small, big)
    return cap * tl.where(t < 0, -th, th)


@triton.jit
def gated_act(g, u, SITU: tl.constexpr, beta, linear_beta):
    """Gated activation of fp32 gate/up values (same shape):
    SITU:  [β1·tanh(g/β1)·σ(g)] · [β2·tanh(u/β2)]      (K3's SiTU-GLU)
    else:  g·σ(g) · u                                   (SwiGLU)"""
    if SITU:
        out = soft_cap(g, beta) * tl.sigmoid(g) * soft_cap(u, linear_beta)
    else:
        out = g * tl.sigmoid(g) * u
    return out


# ----------------------------------------------------------------------------- MXFP4


@triton.jit
def mxfp4_tile(packed_ptr, scale_ptr, stride_p, stride_s, rows, rmask, byte_cols, bmask, OUT_DT: tl.constexpr):
    """Dequantise a tile of MXFP4 rows: bytes ``byte_cols`` [BKH] of rows ``rows`` [BN].

    Returns (even, odd) [BN, BKH] in OUT_DT: the weights of elements 2·byte_cols and 2·byte_cols + 1.
    Masked bytes give 0 (a ragged row's pad nibble is a zero code in the format anyway).

    E2M1 code c -> value, exactly: the magnitude bits e1 e0 m go to fp16 bits 11..9 (two low exponent
    bits + the top mantissa bit), the sign to bit 15; that fp16 is value · 2^-14 for all 16 codes (the
    subnormal 0 and 0.5 included), so value = fp16 · 2^14.
    The 2^14 is folded into the E8M0 factor: 2^(s-127) · 2^14 is the fp32 with exponent field s + 14
    (normal even for s = 0), exact for s <= 240 (|w| <= 6·2^113; larger exponents give inf, no real
    checkpoint has them); s = 255 is NaN, as in the torch reference. The fp16 -> fp32 conversion keeps
    fp16 subnormals. Decoding is inlined here (nested jit calls cost ~1 ms each in the interpreter)."""
    mask = rmask[:, None] & bmask[None, :]
    b = tl.load(packed_ptr + rows[:, None] * stride_p + byte_cols[None, :], mask=mask, other=0).to(tl.int32)
    s = tl.load(scale_ptr + rows[:, None] * stride_s + (byte_cols // 16)[None, :], mask=mask, other=127).to(tl.int32)
    sbits = tl.where(s == 255, 0x7FC00000, tl.minimum(s + 14, 255) << 23)
    factor = sbits.to(tl.float32, bitcast=True)
    lo = (((b & 8) << 12) | ((b & 7) << 9)).to(tl.uint16).to(tl.float16, bitcast=True)
    hi = (((b & 128) << 8) | ((b & 112) << 5)).to(tl.uint16).to(tl.float16, bitcast=True)
    return (lo.to(tl.float32) * factor).to(OUT_DT), (hi.to(tl.float32) * factor).to(OUT_DT)


# ----------------------------------------------------------------------------- contractions


@triton.jit
def contract(x, w, USE_DOT: tl.constexpr):
    """x [BLOCK_R, BK] · w[BN, BK]ᵀ -> [BLOCK_R, BN] fp32.

    USE_DOT: tensor cores (needs BLOCK_R, BN, BK >= 16; x is cast to w's dtype, fp32 operands use the
    exact "ieee" product). Otherwise a broadcast multiply + row sum on the CUDA cores, right for 1..4 rows
    and exact for every dtype under the interpreter."""
    if USE_DOT:
        if w.dtype == tl.float32:
            out = tl.dot(x.to(tl.float32), tl.trans(w), input_precision="ieee")
        else:
            out = tl.dot(x.to(w.dtype), tl.trans(w))
    else:
        out = tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    return out


@triton.jit
def contract_pair(xe, we, xo, wo, USE_DOT: tl.constexpr):
    """xe·weᵀ + xo·woᵀ -> [BLOCK_R, BN] fp32: the even- and odd-element halves of an MXFP4 product."""
    if USE_DOT:
        out = tl.dot(xe.to(we.dtype), tl.trans(we))
        out = tl.dot(xo.to(wo.dtype), tl.trans(wo), out)
    else:
        prod = xe.to(tl.float32)[:, None, :] * we.to(tl.float32)[None, :, :]
        prod += xo.to(tl.float32)[:, None, :] * wo.to(tl.float32)[None, :, :]
        out = tl.sum(prod, axis=2)
    return out


@triton.jit
def row_rstd(x_ptr, stride_x, R, D, eps, DT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_R] fp32 1/sqrt(mean(x²) + eps) of rows x[r, :D], the values first rounded to DT (the twin
    normalises moe_out after casting it to the model dtype). Rows >= R give 1/sqrt(eps) (unused)."""
    r = tl.arange(0, BLOCK_R)
    rmask = r < R
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k0 in tl.range(0, D, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + r[:, None] * stride_x + cols[None, :], mask=rmask[:, None] & (cols < D)[None, :], other=0.0)
        xf = x.to(DT).to(tl.float32)
        acc += tl.sum(xf * xf, axis=1)
    return tl.rsqrt(acc / D + eps)


@triton.jit
def normed_rows(x, cols, cmask, norm_ptr, rstd, HAS_NORM: tl.constexpr, DT: tl.constexpr):
    """RMSNorm of a chunk x [BLOCK_R, BK] (any float dtype) with per-row rstd [BLOCK_R], the way the twin
    rounds it: w ⊙ (x as DT · rstd, rounded to DT), rounded to DT. Without HAS_NORM: x cast to DT."""
    x = x.to(DT)
    if HAS_NORM:
        w = tl.load(norm_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        xn = (x.to(tl.float32) * rstd[:, None]).to(DT).to(tl.float32)
        out = (w[None, :] * xn).to(DT)
    else:
        out = x.to(DT)
    return out


# ----------------------------------------------------------------------------- test kernels


@triton.jit
def _mxfp4_dequant_kernel(packed_ptr, scale_ptr, out_ptr, N, K, stride_p, stride_s, BLOCK_N: tl.constexpr, BLOCK_KH: tl.constexpr):
    """out [N, K] fp32 = dequantised rows (test helper for ``mxfp4_tile``)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    for kb0 in tl.range(0, (K + 1) // 2, BLOCK_KH):
        kb = kb0 + tl.arange(0, BLOCK_KH)
        even, odd = mxfp4_tile(packed_ptr, scale_ptr, stride_p, stride_s, rows, rmask, kb, kb < (K + 1) // 2, tl.float32)
        base = out_ptr + rows[:, None] * K
        tl.store(base + (2 * kb)[None, :], even, mask=rmask[:, None] & (2 * kb < K)[None, :])
        tl.store(base + (2 * kb + 1)[None, :], odd, mask=rmask[:, None] & (2 * kb + 1 < K)[None, :])


def mxfp4_dequantize(packed: torch.Tensor, scale: torch.Tensor, k: int) -> torch.Tensor:
    """packed [N, ceil(K/2)], scale [N, ceil(K/32)] uint8 -> [N, K] fp32 through the kernel decoder."""
    n = packed.shape[0]
    out = torch.empty(n, k, dtype=torch.float32, device=packed.device)
    _mxfp4_dequant_kernel[(triton.cdiv(n, 16),)](packed, scale, out, n, k, packed.stride(0), scale.stride(0), BLOCK_N=16, BLOCK_KH=16)
    return out


@triton.jit
def _gated_act_kernel(g_ptr, u_ptr, out_ptr, n, beta, linear_beta, SITU: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, gated_act(g, u, SITU, beta, linear_beta), mask=m)


def gated_activation(gate: torch.Tensor, up: torch.Tensor, act: str, beta: float = 4.0, linear_beta: float = 25.0) -> torch.Tensor:
    """fp32 act(gate, up) of flat tensors through the kernel activation (test helper)."""
    g, u = gate.reshape(-1).contiguous(), up.reshape(-1).contiguous()
    out = torch.empty(g.shape, dtype=torch.float32, device=g.device)
    _gated_act_kernel[(triton.cdiv(g.numel(), 256),)](g, u, out, g.numel(), beta, linear_beta, SITU=act == "situ", BLOCK=256)
    return out.view(gate.shape)
