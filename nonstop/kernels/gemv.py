"""The GEMV tile every weight-streaming super-op is built on, the RMS helper, and the one matmul helper.

A decode step has R <= 16 rows; a GEMV tile computes, for all of them, BLOCK_N outputs of one weight:

    acc[r, n] = Σ_{k_lo <= k < k_hi} W[rows[n], k] · x̂[r, k]                               fp32 [BLOCK_R, BLOCK_N]
    x̂ = x.to(DT)                                                  (HAS_NORM = False)
    x̂ = (γ ⊙ (x.to(DT) · inv_rms).to(DT)).to(DT)                    (HAS_NORM: RMSNorm exactly as ``model/norms``;
                                                                  inv_rms from ``row_inv_rms``, per tile)

``rows`` [BLOCK_N] are any weight rows (a contiguous block, or e.g. the two channels of RoPE pairs),
masked by ``mask``. With ``PAIR`` a second set ``rows_b`` of ``wb_ptr`` (same row stride) is multiplied
in the same pass, sharing every x load (gate and up projections). DT is the dtype the twin computes in
(the model dtype: ``F.linear`` rounds its inputs there). Products and sums are fp32.

Weight formats (``MXFP4``): dense row-major [N, K] (unit column stride), or MXFP4 - ``wa_ptr`` the packed
bytes [N, ceil(K/2)] (byte j of a row holds the E2M1 codes of elements 2j (low nibble) and 2j+1 (high
nibble)), ``sa_ptr`` the E8M0 scales [N, ceil(K/32)]; bytes are decoded in registers (``mxfp4_decode``)
and the byte's low / high nibbles multiply the even / odd input elements, so no weight is shuffled.
``KB``: bytes per packed row (pass it as an argument: a multiple of 16 lets every byte load be 16 bytes);

How a tile streams its weight: BLOCK_K columns (bytes for MXFP4) per step, the next step's weight tile
loaded before the current one is multiplied (a register double buffer: Triton does not software-pipeline
loads that do not feed ``tl.dot``). ``USE_DOT``: ``tl.dot`` with the rows padded to 16 and the weight dtype's
operands (``UPCAST``: fp32 operands, the interpreter's) - what every launcher passes, for every row count
(``platform.row_block``: one K order, so a row's bits do not depend on the step's other rows); without it
the tile multiplies with FMAs into an [BLOCK_R, BLOCK_N, BLOCK_K] accumulator summed once after the loop
(no launcher uses that variant now).

Public ``@triton.jit`` functions: ``gemv_rows`` (the tile), ``gemv_tile`` (a tile plus its epilogue:
STORE / ADD, see ``store_rows``), the RMS helpers (``row_inv_rms`` of rows in memory, ``vec_inv_rms`` of a
vector in registers, both through ``rms_factor``; ``rms_apply`` / ``rms_scale`` apply it), ``mm`` (every other
matmul), ``mxfp4_decode``. Python: ``gemv_blocks(R, N, K, device)`` and ``launch_gemv(...)``.

Block choice (bf16 on an H100, 132 SMs): BLOCK_N is the largest of 64/32/16 that still gives ~one tile
per SM; BLOCK_K makes each step a ~16 KiB weight tile (BLOCK_N · BLOCK_K = 8192); 8 warps keep the
double buffer and the FMA accumulator in registers (checked by ``nonstop gpucheck``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nonstop.kernels.launch import launcher, pdl_launch_args, require_unit_columns
from nonstop.kernels.platform import num_sms, pipeline_stages, pow2, row_block, upcast_dots

STORE: tl.constexpr = tl.constexpr(0)
ADD: tl.constexpr = tl.constexpr(1)


# ----------------------------------------------------------------------------- matmul and rounding


@triton.jit
def tf32_round(x):
    """fp32 x rounded to tf32 (10 mantissa bits, to nearest, ties away from zero: ``cvt.rna.tf32.f32``)."""
    bits = x.to(tl.int32, bitcast=True)
    return ((bits + 0x1000) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def interpreted_dot(a, b):
    """a [M, K] @ b [K, N] -> fp32, as the interpreter's kernels compute every dot: in fp64, rounded once to
    fp32. The interpreter hands a dot to numpy's BLAS, whose fp32 GEMM may sum a row in another order at
    another row position of the same product (OpenBLAS on a Zen 5 EPYC: rows 6-15 of 16 differ from rows
    0-5 in the last bit), which would make a row's bits depend on the batch around it; the fp64 sums agree
    to far below fp32's rounding, so the rounded row does not (row position probe: 0 of 1,600 differ)."""
    return tl.dot(a.to(tl.float64), b.to(tl.float64), input_precision="ieee").to(tl.float32)


@triton.jit
def mm(a, b, UPCAST: tl.constexpr, PREC: tl.constexpr, TF32_ROUND: tl.constexpr = False):
    """a [M, K] @ b [K, N] -> [M, N] fp32 (``tl.dot``; M, N, K >= 16). UPCAST: the interpreter (whose bf16
    dot is wrong): fp32 operands, after rounding to tf32 when TF32_ROUND (the GPU numerics mode, for dots
    the GPU runs in tf32), multiplied by ``interpreted_dot``; else ``input_precision=PREC`` (``platform.dot_mode``)."""
    if UPCAST:
        a32 = a.to(tl.float32)
        b32 = b.to(tl.float32)
        if TF32_ROUND:
            a32 = tf32_round(a32)
            b32 = tf32_round(b32)
        out = interpreted_dot(a32, b32)
    else:
        out = tl.dot(a, b, input_precision=PREC)
    return out


@triton.jit
def row_inv_rms(x_ptr, stride_x, R, K, eps, DT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_R] fp32: 1 / sqrt(mean_k x[r, k]² + eps) of rows r < R of x [R, K] (unit column stride),
    the values first rounded to DT (what the twin normalises). Rows >= R give 1/sqrt(eps) (unused)."""
    rows = tl.arange(0, BLOCK_R)
    sq = tl.zeros([BLOCK_R, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        mask = (rows[:, None] < R) & (ks[None, :] < K)
        x = (
            tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + ks[None, :], mask=mask, other=0.0)
            .to(DT)
            .to(tl.float32)
        )
        sq += x * x
    return rms_factor(tl.sum(sq, axis=1), K, eps)


@triton.jit
def rms_factor(sum_sq, K, eps):
    """RMSNorm's factor 1 / sqrt(sum_sq / K + eps) of K values whose squares sum to ``sum_sq`` (fp32, any
    shape): the one place the RMS is written (``row_inv_rms``, ``vec_inv_rms``)."""
    return tl.rsqrt(sum_sq / K + eps)


@triton.jit
def vec_inv_rms(x, K, eps):
    """1 / sqrt(mean x² + eps) of a vector x [BLOCK] (fp32) already in registers; lanes >= K must hold 0.
    (The sum is over all of x, not ``axis=0``: the same registers under Triton 3.6 as the sites it replaced.)"""
    return rms_factor(tl.sum(x * x), K, eps)


@triton.jit
def rms_apply(x, inv_rms, gamma, DT: tl.constexpr):
    """The twin's RMSNorm rounding of a chunk: (γ ⊙ (x · inv_rms).to(DT)).to(DT); x [BR, BK] (any float),
    inv_rms [BR], γ [BK]. (x of more dimensions: ``rms_scale`` with inv_rms and γ already broadcast.)"""
    return rms_scale(x, inv_rms[:, None], gamma[None, :], DT)


@triton.jit
def rms_scale(x, inv_rms, gamma, DT: tl.constexpr):
    """(γ ⊙ (x · inv_rms).to(DT)).to(DT) with inv_rms and γ broadcastable to x."""
    xn = (x.to(DT).to(tl.float32) * inv_rms).to(DT).to(tl.float32)
    return (gamma.to(tl.float32) * xn).to(DT)


@triton.jit
def mxfp4_decode(b, s, OUT_DT: tl.constexpr):
    """Packed E2M1 bytes b [..] (uint8) with their E8M0 scale exponents s [..] -> (even, odd) in OUT_DT:
    the values of each byte's low and high nibble.

    E2M1 code c -> value, exactly: the magnitude bits e1 e0 m go to fp16 bits 11..9 (two low exponent bits
    + the top mantissa bit), the sign to bit 15; that fp16 is value · 2^-14 for all 16 codes (the
    subnormal 0 and 0.5 included), so value = fp16 · 2^14. The 2^14 is folded into the scale: 2^(s-127) ·
    2^14 is the fp32 with exponent field s + 14 (normal even for s = 0), exact for s <= 240 (larger
    exponents give inf; no real checkpoint has them); s = 255 is NaN, as in the torch reference."""
    b = b.to(tl.int32)
    s = s.to(tl.int32)
    factor = tl.where(s == 255, 0x7FC00000, tl.minimum(s + 14, 255) << 23).to(tl.float32, bitcast=True)
    lo = (((b & 8) << 12) | ((b & 7) << 9)).to(tl.uint16).to(tl.float16, bitcast=True)
    hi = (((b & 128) << 8) | ((b & 112) << 5)).to(tl.uint16).to(tl.float16, bitcast=True)
    return (lo.to(tl.float32) * factor).to(OUT_DT), (hi.to(tl.float32) * factor).to(OUT_DT)


# ----------------------------------------------------------------------------- the tile


@triton.jit
def mac(acc, x, w, USE_DOT: tl.constexpr, UPCAST: tl.constexpr):
    """acc + x [BR, BK] · w [BN, BK]ᵀ. USE_DOT: ``tl.dot`` into acc [BR, BN] (fp32 weights exactly; else
    operands in w's dtype; with UPCAST, the interpreter, ``interpreted_dot`` on fp32 operands); otherwise
    FMAs into acc [BR, BN, BK] (summed by ``mac_sum``)."""
    if USE_DOT:
        if UPCAST:
            acc += interpreted_dot(x.to(tl.float32), tl.trans(w.to(tl.float32)))
        elif w.dtype == tl.float32:
            acc = tl.dot(x.to(tl.float32), tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x.to(w.dtype), tl.trans(w), acc)
    else:
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def mac_groups(acc, xe, we, xo, wo, USE_DOT: tl.constexpr, UPCAST: tl.constexpr):
    """acc [BR, BN] + the products of an MXFP4 step: xe, xo [BR, NS, 16] the inputs of the bytes' low / high
    nibbles, we, wo [BN, NS, 16] their values. Two ``mac`` dots over the step flattened to NS·16, or the FMA
    products summed over the step right away."""
    BR: tl.constexpr = xe.shape[0]
    BN: tl.constexpr = we.shape[0]
    W: tl.constexpr = we.shape[1] * we.shape[2]
    if USE_DOT:
        acc = mac(acc, tl.reshape(xe, [BR, W]), tl.reshape(we, [BN, W]), USE_DOT, UPCAST)
        acc = mac(acc, tl.reshape(xo, [BR, W]), tl.reshape(wo, [BN, W]), USE_DOT, UPCAST)
    else:
        prod = (
            xe.to(tl.float32)[:, None] * we.to(tl.float32)[None] + xo.to(tl.float32)[:, None] * wo.to(tl.float32)[None]
        )
        acc += tl.sum(tl.sum(prod, axis=3), axis=2)
    return acc


@triton.jit
def mac_sum(acc, USE_DOT: tl.constexpr):
    if USE_DOT:
        out = acc
    else:
        out = tl.sum(acc, axis=2)
    return out


@triton.jit
def gemv_rows(
    x_ptr,
    stride_x,
    R,
    k_lo,
    k_hi,
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
    mask,
    HAS_NORM: tl.constexpr,
    PAIR: tl.constexpr,
    MXFP4: tl.constexpr,
    DT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """(x̂ W_a[rows]ᵀ, x̂ W_b[rows_b]ᵀ) over input columns [k_lo, k_hi), fp32 [BLOCK_R, BLOCK_N] each (the
    second is zeros without PAIR); see the module docstring. x [R, *] row stride ``stride_x``; norm γ [K];
    inv_rms [BLOCK_R]. Dense: w rows of stride ``stride_w``. MXFP4: w the packed bytes (row stride
    ``stride_w``), s the scales (``stride_s``), KB bytes per row, BLOCK_K elements (a multiple of 32) per
    step; k_lo must be 0."""
    BLOCK_N: tl.constexpr = rows.shape[0]
    r = tl.arange(0, BLOCK_R)
    rmask = r < R
    x_rows = x_ptr + r[:, None].to(tl.int64) * stride_x
    wa_row = wa_ptr + rows[:, None].to(tl.int64) * stride_w
    wb_row = wb_ptr + rows_b[:, None].to(tl.int64) * stride_w
    sa_row = sa_ptr + rows[:, None].to(tl.int64) * stride_s
    sb_row = sb_ptr + rows_b[:, None].to(tl.int64) * stride_s
    if USE_DOT or MXFP4:  # MXFP4 FMAs sum each step (its decoded pairs already take the registers of a 3-D acc)
        acc_a = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
    else:
        acc_a = tl.zeros([BLOCK_R, BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_R, BLOCK_N, BLOCK_K], dtype=tl.float32)
    if MXFP4:
        # a step's bytes as [BLOCK_N, NS, 16]: NS scale groups of 16 bytes (32 elements) per row, so each
        # group's scale broadcasts over its bytes (no reshape; one 16-byte load per thread and group)
        BC: tl.constexpr = BLOCK_K // 2
        NS: tl.constexpr = BLOCK_K // 32
        grp = tl.arange(0, NS)
        byte = grp[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]  # [1, NS, 16] byte of the step
        pair = byte[:, :, :, None] * 2 + tl.arange(0, 2)[None, None, None, :]  # [1, NS, 16, 2] its two inputs
        wa_row3 = wa_ptr + rows[:, None, None].to(tl.int64) * stride_w
        wb_row3 = wb_ptr + rows_b[:, None, None].to(tl.int64) * stride_w
        x_rows4 = x_ptr + r[:, None, None, None].to(tl.int64) * stride_x
        m3 = mask[:, None, None]
        wa = tl.load(wa_row3 + byte, mask=m3 & (byte < KB), other=0)
        wb = wa
        if PAIR:
            wb = tl.load(wb_row3 + byte, mask=m3 & (byte < KB), other=0)
        # not software-pipelined: the register double buffer streams the bytes
        for k0 in tl.range(0, k_hi, BLOCK_K, num_stages=1):
            nb = k0 // 2 + BC + byte
            wa_next = tl.load(wa_row3 + nb, mask=m3 & (nb < KB), other=0)  # the next step's bytes in flight
            wb_next = wa_next
            if PAIR:
                wb_next = tl.load(wb_row3 + nb, mask=m3 & (nb < KB), other=0)
            ks = k0 + pair
            x = tl.load(x_rows4 + ks, mask=rmask[:, None, None, None] & (ks < k_hi), other=0.0).to(DT)
            if HAS_NORM:
                x = rms_scale(x, inv_rms[:, None, None, None], tl.load(norm_ptr + ks, mask=ks < k_hi, other=0.0), DT)
            xe, xo = tl.split(x)  # [BLOCK_R, NS, 16]: the inputs of each byte's low / high nibble
            lo, hi = _decode_step(wa, sa_row, k0, mask, KB, DT, USE_DOT, NS)
            acc_a = mac_groups(acc_a, xe, lo, xo, hi, USE_DOT, UPCAST)
            if PAIR:
                lo, hi = _decode_step(wb, sb_row, k0, mask, KB, DT, USE_DOT, NS)
                acc_b = mac_groups(acc_b, xe, lo, xo, hi, USE_DOT, UPCAST)
            wa = wa_next
            wb = wb_next
    else:
        ks = k_lo + tl.arange(0, BLOCK_K)
        cmask = mask[:, None] & (ks < k_hi)[None, :]
        wa = tl.load(wa_row + ks[None, :], mask=cmask, other=0.0)
        wb = wa
        if PAIR:
            wb = tl.load(wb_row + ks[None, :], mask=cmask, other=0.0)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
            ks = k0 + tl.arange(0, BLOCK_K)
            nmask = mask[:, None] & (ks + BLOCK_K < k_hi)[None, :]
            wa_next = tl.load(wa_row + BLOCK_K + ks[None, :], mask=nmask, other=0.0)  # the next step's tile in flight
            wb_next = wa_next
            if PAIR:
                wb_next = tl.load(wb_row + BLOCK_K + ks[None, :], mask=nmask, other=0.0)
            x = tl.load(x_rows + ks[None, :], mask=rmask[:, None] & (ks < k_hi)[None, :], other=0.0).to(DT)
            if HAS_NORM:
                x = rms_apply(x, inv_rms, tl.load(norm_ptr + ks, mask=ks < k_hi, other=0.0), DT)
            acc_a = mac(acc_a, x, wa, USE_DOT, UPCAST)
            if PAIR:
                acc_b = mac(acc_b, x, wb, USE_DOT, UPCAST)
            wa = wa_next
            wb = wb_next
    return mac_sum(acc_a, USE_DOT or MXFP4), mac_sum(acc_b, USE_DOT or MXFP4)


@triton.jit
def _decode_step(b, s_row, k0, mask, KB, DT: tl.constexpr, USE_DOT: tl.constexpr, NS: tl.constexpr):
    """Decode a step's bytes b [BLOCK_N, NS, 16] (bytes k0/2 .. of rows ``mask``) with the step's NS scales of
    each row, loaded as one [BLOCK_N, NS] block (one load per thread: a tile of 32 rows by 8 groups spreads
    one scale per thread of 8 warps) and broadcast over their 16 bytes: (even, odd) values [BLOCK_N, NS, 16],
    in DT for the tensor cores, fp32 for FMAs. (Loading them as int32 words of four and splitting those
    costs Triton 3.6 ~100 registers a thread: a reshape.)"""
    g = k0 // 32 + tl.arange(0, NS)
    sc = tl.load(s_row + g[None, :], mask=mask[:, None] & (g * 16 < KB)[None, :], other=127)
    if USE_DOT:
        lo, hi = mxfp4_decode(b, sc[:, :, None], DT)
    else:
        lo, hi = mxfp4_decode(b, sc[:, :, None], tl.float32)
    return lo, hi


@triton.jit
def store_rows(y, out_ptr, stride_out, rows, cols, R, N, EPILOGUE: tl.constexpr, ROUND_TY: tl.constexpr):
    """Write y [BR, BN] (fp32) to out[rows, cols] by EPILOGUE (STORE: out = y; ADD: out = out + y in fp32,
    one rounding); ROUND_TY (a dtype or None) rounds y first (what ``F.linear`` in the model dtype returns).
    No atomics: every output element has one writer, so results do not depend on scheduling."""
    mask = (rows[:, None] < R) & (cols[None, :] < N)
    ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_out + cols[None, :]
    if ROUND_TY is not None:
        y = y.to(ROUND_TY).to(tl.float32)
    if EPILOGUE == ADD:
        y = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32) + y
    tl.store(ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gemv_tile(
    tile,
    x_ptr,
    stride_x,
    norm_ptr,
    eps,
    w_ptr,
    stride_w,
    b_ptr,
    out_ptr,
    stride_out,
    R,
    N,
    K,
    HAS_NORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EPILOGUE: tl.constexpr,
    ROUND_Y: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """One [R, BLOCK_N] tile of out (by EPILOGUE) y = W x̂ (+ b): output rows tile·BLOCK_N .. over the whole
    K. x [R, K]; norm γ [K]; w [N, K]; b [N]; out [R, N]. ROUND_Y: round y to the weight's dtype first (what
    ``F.linear`` in the model dtype returns). Tiles: cdiv(N, BLOCK_N)."""
    DT: tl.constexpr = w_ptr.dtype.element_ty
    rows = tl.arange(0, BLOCK_R)
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_NORM:
        inv_rms = row_inv_rms(x_ptr, stride_x, R, K, eps, DT, BLOCK_R, BLOCK_K)
    else:
        inv_rms = tl.full([BLOCK_R], 1.0, tl.float32)
    acc, _ = gemv_rows(
        x_ptr,
        stride_x,
        R,
        0,
        K,
        norm_ptr,
        inv_rms,
        w_ptr,
        w_ptr,
        stride_w,
        w_ptr,
        w_ptr,
        0,
        0,
        cols,
        cols,
        cols < N,
        HAS_NORM,
        False,
        False,
        DT,
        BLOCK_R,
        BLOCK_K,
        USE_DOT,
        UPCAST,
        NUM_STAGES,
    )
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if ROUND_Y:
        store_rows(acc, out_ptr, stride_out, rows, cols, R, N, EPILOGUE, DT)
    else:
        store_rows(acc, out_ptr, stride_out, rows, cols, R, N, EPILOGUE, None)


gemv_kernel = launcher(gemv_tile, prefetch=("w_ptr", "pid * BLOCK_N * stride_w", "BLOCK_N * stride_w"))


# ----------------------------------------------------------------------------- blocks and the launch


def pick_block_n(N: int, sms: int, choices=(64, 32, 16)) -> int:
    """The largest tile height that still gives about one tile per SM (>= 0.9 waves)."""
    for b in choices:
        if triton.cdiv(N, b) >= 0.9 * sms:
            return b
    return choices[-1]


def pick_block_k(K: int, BLOCK_R: int, BLOCK_N: int, USE_DOT: bool, budget: int = 8192) -> int:
    """K step: a weight tile of ~``budget`` elements (16 KiB bf16) per step; the FMA path also keeps an
    fp32 accumulator of BLOCK_R·BLOCK_N·BLOCK_K values, the mma path a [BLOCK_R, BLOCK_N] one."""
    per_step = budget // BLOCK_N if USE_DOT else budget // (BLOCK_R * BLOCK_N)
    return max(16, min(per_step, 512, pow2(K)))


def gemv_blocks(R: int, N: int, K: int, device) -> dict:
    """Constexpr block sizes (and num_warps) of ``gemv_tile`` over R rows of an [N, K] weight."""
    BLOCK_R, USE_DOT = row_block(R)
    BLOCK_N = pick_block_n(N, num_sms(device))
    BLOCK_K = pick_block_k(K, BLOCK_R, BLOCK_N, USE_DOT)
    return dict(
        BLOCK_R=BLOCK_R,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        USE_DOT=USE_DOT,
        UPCAST=upcast_dots(),
        NUM_STAGES=pipeline_stages(),
        num_warps=8,
    )


def _check_gemv_operands(x, w, out, bias, norm) -> None:
    """ValueError unless x [R <= 16, K], w [N, K], out [R, N], bias [N] and norm [K] fit together with unit
    column strides (the kernel reads and writes by these shapes: a narrower w or out is read past / written
    past, not refused)."""
    R, K = x.shape
    N = w.shape[0]
    shapes = f"x {list(x.shape)}, w {list(w.shape)}, out {list(out.shape)}"
    if w.dim() != 2 or w.shape[1] != K or tuple(out.shape) != (R, N):
        raise ValueError(f"gemv needs x [R, K], w [N, K], out [R, N]; got {shapes}")
    if bias is not None and tuple(bias.shape) != (N,) or norm is not None and tuple(norm.shape) != (K,):
        raise ValueError(f"gemv needs bias [N] and norm [K]; got {shapes}")
    require_unit_columns("gemv", x=x, w=w, out=out, bias=bias, norm=norm)
    if R > 16:
        raise ValueError(f"gemv takes at most 16 rows, got {R}")


def launch_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    *,
    bias=None,
    norm=None,
    eps: float = 0.0,
    epilogue: int = 0,
    round_y: bool = False,
    env=None,
    **blocks,
) -> None:
    """out (by ``epilogue``) W x̂ (+ bias) for x [R, K], w [N, K], out [R, N] - one launch of ``gemv_tile``."""
    R, K = x.shape
    N = w.shape[0]
    _check_gemv_operands(x, w, out, bias, norm)
    cfg = gemv_blocks(R, N, K, x.device) | blocks
    grid = (triton.cdiv(N, cfg["BLOCK_N"]),)
    gemv_kernel[grid](
        x,
        x.stride(0),
        norm if norm is not None else w,
        eps,
        w,
        w.stride(0),
        bias if bias is not None else w,
        out,
        out.stride(0),
        R,
        N,
        K,
        HAS_NORM=norm is not None,
        HAS_BIAS=bias is not None,
        EPILOGUE=int(epilogue),
        ROUND_Y=round_y,
        **cfg,
        **pdl_launch_args(env),
    )
