"""The GEMV tile shared by every weight-streaming super-op (decode: R <= 16 rows against one weight).

    y[r, n] = Σ_k W[n, k] · x̂[r, k]  (+ b[n])          r < R (<= 16), n in this tile's BLOCK_N rows
    x̂ = x                                              (HAS_NORM = False)
    x̂ = γ ⊙ (x / sqrt(mean_k x² + eps)).to(x.dtype)     (HAS_NORM: RMSNorm exactly as ``model/norms.rms_norm``,
                                                        recomputed by every tile from the whole row)

Products and the accumulation are fp32. The weight is row-major [N, K] with unit column stride, streamed
exactly once per step: a tile owns BLOCK_N output rows and walks K in BLOCK_K steps, loading the next
weight step before multiplying the current one (a register double buffer: Triton 3.9 does not software-
pipeline loads that do not feed ``tl.dot``). Rows x [R, K] are tiny and re-read from L2 by every tile.

Public tile functions (``@triton.jit``, callable from any kernel, the megakernel included):

``gemv_tile(tile, x_ptr, stride_x, norm_ptr, eps, w_ptr, stride_w, b_ptr, out_ptr, stride_out, R, N, K,
            HAS_NORM, HAS_BIAS, EPILOGUE, ROUND_Y, SPLIT_K, BLOCK_R, BLOCK_N, BLOCK_K, USE_DOT, UPCAST, NUM_STAGES)``
    tile in [0, cdiv(N, BLOCK_N) · SPLIT_K): output rows (tile // SPLIT_K)·BLOCK_N .. +BLOCK_N, K slice
    tile % SPLIT_K (SPLIT_K > 1 needs EPILOGUE = ATOMIC; the bias is added by slice 0).
    x: [R, K] (any float dtype) row stride ``stride_x``; norm: γ [K]; w: [N, K] row stride ``stride_w``;
    b: [N]; out: [R, N] row stride ``stride_out``. Pointers that a flag disables may be any tensor.
    EPILOGUE (``STORE``/``ADD``/``ATOMIC``):
        STORE   out = y                                 (cast to out's dtype)
        ADD     out = (out + y.to(out dtype))           (residual add in fp32, one rounding, as the twins' ``emit``)
        ATOMIC  out += y with fp32 ``tl.atomic_add``     (relaxed; out must be fp32 and zeroed by someone earlier;
                                                        split-K / cross-tile reductions)
    ROUND_Y: round y to the weight's dtype first (what ``F.linear`` in the model dtype returns) - set it for
    STORE into fp32 (the LM head's ``F.linear(x, W).float()``) and for ADD; never for ATOMIC partial sums.
    BLOCK_R, USE_DOT (``block_rows``): R = 1 multiplies with FMAs into an [1, BLOCK_N, BLOCK_K] fp32
    accumulator (summed over K once, after the loop); R = 2..16 uses ``tl.dot`` with BLOCK_R = 16 (mma).
    UPCAST: feed ``tl.dot`` fp32 operands (required under the interpreter, whose bf16 dot is wrong).
    NUM_STAGES: passed to ``tl.range`` (a hint; see above).

Building blocks, for kernels that need their own loop (e.g. the fused MLP in ``common.py``):
``row_inv_rms(x_ptr, stride_x, R, K, eps, BLOCK_R, BLOCK_K) -> [BLOCK_R] fp32``   1 / sqrt(mean x² + eps)
``load_input_block(x_ptr, stride_x, rows, ks, R, K, norm_ptr, inv_rms, HAS_NORM) -> x̂ [BLOCK_R, BLOCK_K]``
``mac_zeros(BLOCK_R, BLOCK_N, BLOCK_K, USE_DOT)``, ``mac(acc, x, w, USE_DOT, UPCAST)``, ``mac_sum(acc, USE_DOT)``
    acc += x [BR, BK] · w [BN, BK]ᵀ; ``mac_sum`` gives the [BR, BN] fp32 result
``store_rows(y, out_ptr, stride_out, rows, cols, R, N, EPILOGUE, ROUND_TY)``   the epilogue alone

Python side: ``gemv_blocks(R, N, K, device)`` -> the constexpr blocks + num_warps; ``launch_gemv(x, w, out,
bias=, norm=, eps=, epilogue=, round_y=, split_k=, **overrides)`` runs one GEMV as its own launch.

Block choice (bf16 on an H100, 132 SMs): BLOCK_N is the largest of 64/32/16 that still gives ~one tile
per SM (o_proj 2048 x 2048: 128 tiles of 16 rows = 64 KiB each; LM head 128256 x 2048: 2004 tiles of
64 rows = 256 KiB each); BLOCK_K makes each step a ~16 KiB weight tile (BLOCK_N · BLOCK_K = 8192); 8 warps
keep the double buffer and the FMA accumulator in registers without spills (80-210 registers, checked
by compiling for sm_90).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from nonstop.kernels.pdl import pdl_launch_args, pdl_wait

STORE: tl.constexpr = tl.constexpr(0)
ADD: tl.constexpr = tl.constexpr(1)
ATOMIC: tl.constexpr = tl.constexpr(2)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def num_sms(device) -> int:
    """Streaming multiprocessors of ``device`` (a small stand-in on CPU: fewer, larger tiles interpret faster)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2


def block_rows(R: int) -> tuple[int, bool]:
    """(BLOCK_R, USE_DOT): one row multiplies with FMAs; 2..16 rows use ``tl.dot`` (mma, M padded to 16)."""
    if R <= 1:
        return 1, False
    return 16, True


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
    return max(16, min(per_step, 512, triton.next_power_of_2(K)))


def gemv_blocks(R: int, N: int, K: int, device) -> dict:
    """Constexpr block sizes (and num_warps) for ``gemv_tile`` over R rows of an [N, K] weight."""
    BLOCK_R, USE_DOT = block_rows(R)
    BLOCK_N = pick_block_n(N, num_sms(device))
    BLOCK_K = pick_block_k(K, BLOCK_R, BLOCK_N, USE_DOT)
    # 8 warps: the FMA accumulator and the double-buffered weight tiles fit without spills (sm_90, ~80-210 registers)
    return dict(BLOCK_R=BLOCK_R, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, USE_DOT=USE_DOT, UPCAST=interpreting(), NUM_STAGES=1 if interpreting() else 3, num_warps=8)


# ----------------------------------------------------------------------------- tile helpers


@triton.jit
def row_inv_rms(x_ptr, stride_x, R, K, eps, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_R] fp32: 1 / sqrt(mean_k x[r, k]² + eps) of rows r < R (x [R, K], unit column stride)."""
    rows = tl.arange(0, BLOCK_R)
    sq = tl.zeros([BLOCK_R, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        mask = (rows[:, None] < R) & (ks[None, :] < K)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + ks[None, :], mask=mask, other=0.0).to(tl.float32)
        sq += x * x
    return tl.rsqrt(tl.sum(sq, axis=1) / K + eps)


@triton.jit
def load_input_block(x_ptr, stride_x, rows, ks, R, K, norm_ptr, inv_rms, HAS_NORM: tl.constexpr):
    """x̂[rows, ks] in x's dtype; zero outside [R, K]. With HAS_NORM: γ ⊙ (x · inv_rms).to(x.dtype)."""
    mask = (rows[:, None] < R) & (ks[None, :] < K)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + ks[None, :], mask=mask, other=0.0)
    if HAS_NORM:
        gamma = tl.load(norm_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
        normed = (x.to(tl.float32) * inv_rms[:, None]).to(x.dtype)
        x = (gamma[None, :] * normed.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def mac_zeros(BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr):
    """A zero accumulator for ``mac``: [BLOCK_R, BLOCK_N] (mma) or [BLOCK_R, BLOCK_N, BLOCK_K] (FMA)."""
    if USE_DOT:
        acc = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_R, BLOCK_N, BLOCK_K], dtype=tl.float32)
    return acc


@triton.jit
def mac(acc, x, w, USE_DOT: tl.constexpr, UPCAST: tl.constexpr):
    """acc + x [BR, BK] · w [BN, BK]ᵀ, fp32 products and sums. USE_DOT: ``tl.dot`` into acc [BR, BN];
    otherwise element-wise FMAs into acc [BR, BN, BK] (no reduction inside the K loop; ``mac_sum`` at the end)."""
    if USE_DOT:
        if UPCAST:
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        elif x.dtype == tl.float32:
            acc = tl.dot(x, tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc)
    else:
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def mac_sum(acc, USE_DOT: tl.constexpr):
    """[BR, BN] fp32 result of a ``mac`` accumulator."""
    if USE_DOT:
        out = acc
    else:
        out = tl.sum(acc, axis=2)
    return out


@triton.jit
def store_rows(y, out_ptr, stride_out, rows, cols, R, N, EPILOGUE: tl.constexpr, ROUND_TY: tl.constexpr):
    """Write y [BR, BN] (fp32) to out[rows, cols] by EPILOGUE; ROUND_TY (a dtype or None) rounds y first."""
    mask = (rows[:, None] < R) & (cols[None, :] < N)
    ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_out + cols[None, :]
    if EPILOGUE == ATOMIC:
        tl.atomic_add(ptrs, y, mask=mask, sem="relaxed")
    else:
        if ROUND_TY is not None:
            y = y.to(ROUND_TY).to(tl.float32)
        if EPILOGUE == ADD:
            y = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32) + y
        tl.store(ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gemv_tile(tile, x_ptr, stride_x, norm_ptr, eps, w_ptr, stride_w, b_ptr, out_ptr, stride_out, R, N, K,
              HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, ROUND_Y: tl.constexpr,
              SPLIT_K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              USE_DOT: tl.constexpr, UPCAST: tl.constexpr, NUM_STAGES: tl.constexpr):
    """One [R, BLOCK_N] tile of y = W x̂ (+ b); see the module docstring."""
    n_tile = tile // SPLIT_K
    k_slice = tile % SPLIT_K
    rows = tl.arange(0, BLOCK_R)
    cols = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_NORM:
        inv_rms = row_inv_rms(x_ptr, stride_x, R, K, eps, BLOCK_R, BLOCK_K)
    else:
        inv_rms = tl.full([BLOCK_R], 1.0, tl.float32)
    k_len = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = k_slice * k_len
    k_hi = tl.minimum(k_lo + k_len, K)
    w_rows = w_ptr + cols[:, None].to(tl.int64) * stride_w
    n_mask = cols[:, None] < N
    acc = mac_zeros(BLOCK_R, BLOCK_N, BLOCK_K, USE_DOT)
    # register double buffer: the next weight tile is in flight while this one is multiplied
    ks = k_lo + tl.arange(0, BLOCK_K)
    w = tl.load(w_rows + ks[None, :], mask=n_mask & (ks[None, :] < k_hi), other=0.0)
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
        ks = k0 + tl.arange(0, BLOCK_K)
        w_next = tl.load(w_rows + BLOCK_K + ks[None, :], mask=n_mask & (ks[None, :] + BLOCK_K < k_hi), other=0.0)
        x = load_input_block(x_ptr, stride_x, rows, ks, R, k_hi, norm_ptr, inv_rms, HAS_NORM)
        acc = mac(acc, x, w, USE_DOT, UPCAST)
        w = w_next
    acc = mac_sum(acc, USE_DOT)
    if HAS_BIAS:
        bias = tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        if SPLIT_K > 1:
            bias = tl.where(k_slice == 0, bias, 0.0)  # one K slice adds the bias
        acc += bias[None, :]
    if ROUND_Y:
        store_rows(acc, out_ptr, stride_out, rows, cols, R, N, EPILOGUE, w_ptr.dtype.element_ty)
    else:
        store_rows(acc, out_ptr, stride_out, rows, cols, R, N, EPILOGUE, None)


@triton.jit
def _gemv_kernel(x_ptr, stride_x, norm_ptr, eps, w_ptr, stride_w, b_ptr, out_ptr, stride_out, R, N, K,
                 HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, ROUND_Y: tl.constexpr,
                 SPLIT_K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 USE_DOT: tl.constexpr, UPCAST: tl.constexpr, NUM_STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    gemv_tile(tl.program_id(0), x_ptr, stride_x, norm_ptr, eps, w_ptr, stride_w, b_ptr, out_ptr, stride_out, R, N, K,
              HAS_NORM, HAS_BIAS, EPILOGUE, ROUND_Y, SPLIT_K, BLOCK_R, BLOCK_N, BLOCK_K, USE_DOT, UPCAST, NUM_STAGES)


def launch_gemv(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *, bias=None, norm=None, eps: float = 0.0,
                epilogue: int = 0, round_y: bool = False, split_k: int = 1, env=None, **blocks) -> None:
    """out (by ``epilogue``) W x̂ (+ bias) for x [R, K], w [N, K], out [R, N] - one launch of ``gemv_tile``
    (with PDL when the step's ``env`` allows it: ``pdl_launch_args``)."""
    R, K = x.shape
    N = w.shape[0]
    assert x.stride(-1) == 1 and w.stride(-1) == 1 and out.stride(-1) == 1 and R <= 16
    assert split_k == 1 or int(epilogue) == int(ATOMIC), "split-K partial sums need the ATOMIC epilogue"
    cfg = gemv_blocks(R, N, K, x.device) | blocks
    grid = (triton.cdiv(N, cfg["BLOCK_N"]) * split_k,)
    _gemv_kernel[grid](x, x.stride(0), norm if norm is not None else w, eps, w, w.stride(0), bias if bias is not None else w,
                       out, out.stride(0), R, N, K, HAS_NORM=norm is not None, HAS_BIAS=bias is not None, EPILOGUE=int(epilogue),
                       ROUND_Y=round_y, SPLIT_K=split_k, **cfg, **pdl_launch_args(env))
