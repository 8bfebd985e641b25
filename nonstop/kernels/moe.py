"""MoE super-op kernels: ``moe_front``, ``moe_experts``, ``moe_tail`` (twins in ``program/reference.py``).

A MoE layer of a step of R rows (x [R, d] the FFN input, ℓ the expert width: K3's latent, else d):

moe_front   one pass over [router (fp32, E×d) | latent_down (ℓ×d) | shared gate/up (2S×d)], all reading
            xn = RMSNorm(x) (recomputed per tile):
              moe_logits [R, E] fp32 = xn·W_rᵀ;  moe_in [R, ℓ] = xn·W↓ᵀ (latent) or xn;
              moe_shared_act [R, S] = act(xn·W_sgᵀ, xn·W_suᵀ);  moe_out [R, ℓ] fp32 = 0.
            Tiles: ceil(E/BLOCK_NR) router tiles, ceil(ℓ/BLOCK_N) latent (or copy) tiles that also zero
            their columns of moe_out, ceil(S/BLOCK_N) shared tiles (gate rows n and up rows S+n).
moe_experts a persistent launch (2 programs per SM): each program computes the top-k selection once from
            moe_logits (``moe_routing``), then strides over the work items (slot, chunk): the slot-th
            distinct selected expert e (id order) and its intermediate rows chunk·BLOCK_I .. +BLOCK_I:
            a = act(z·W1[e, chunk]ᵀ, z·W3[e, chunk]ᵀ) for all rows that chose e, then
            moe_out[r] += p[r, e] · W2[e][:, chunk]·a[r] by fp32 atomic adds (split-K over the
            intermediate dim). Every selected expert's weights are read once per step, for all its rows,
            in routing (id) order; only the n_distinct·ceil(I/BLOCK_I) real items are visited.
            Dense experts or MXFP4 (decoded in registers: a byte's low/high nibbles pair with the even/odd
            input elements, so no weight shuffle is needed).
moe_tail    target (+)= W↑ RMSNorm(moe_out as DT) (latent; plain moe_out otherwise) + W_sd moe_shared_act.
            Tiles over BLOCK_N output columns of d; each recomputes the latent norm of its rows.

moe_out is zeroed by moe_front (always the predecessor of moe_experts), so moe_experts accumulates.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from nonstop.kernels.moe_math import contract, contract_pair, gated_act, mxfp4_tile, normed_rows, row_rstd
from nonstop.kernels.moe_routing import route_summary, routing_blocks, slot_expert
from nonstop.kernels.pdl import pdl_launch_args, pdl_wait

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
FORCE_DOT: bool | None = None  # tests force the tensor-core path (fp32/fp16 dots are exact in the interpreter)
DOT_MIN_ROWS = 5  # on a GPU, rows >= this use tl.dot (M padded to 16); fewer rows use CUDA-core GEMVs
# interpreter block sizes: large (whole tiny rows, few numpy steps); tests shrink them to get many tiles,
# several K steps and ragged last chunks out of the tiny configs
INTERPRET_BLOCKS = {"n": 64, "k": 128, "i": 64}


# ----------------------------------------------------------------------------- shared tile pieces


@triton.jit
def gemv_rows(x_ptr, stride_x, rmask, K, norm_ptr, rstd, w_ptr, stride_w, rows_a, mask_a, rows_b, mask_b,
              HAS_NORM: tl.constexpr, PAIR: tl.constexpr, DT: tl.constexpr,
              BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr, NUM_STAGES: tl.constexpr):
    """(x̂·W[rows_a]ᵀ, x̂·W[rows_b]ᵀ) [BLOCK_R, BLOCK_N] fp32, x̂ = rows of x (rmask) cast to DT and
    RMS-normalised with rstd when HAS_NORM; W [N, K] row-major. Without PAIR the second is zeros.
    One pass over K: the x chunk is loaded (and normalised) once for both weight tiles."""
    r = tl.arange(0, BLOCK_R)
    acc_a = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        cols = k0 + tl.arange(0, BLOCK_K)
        cmask = cols < K
        x = tl.load(x_ptr + r[:, None] * stride_x + cols[None, :], mask=rmask[:, None] & cmask[None, :], other=0.0)
        x = normed_rows(x, cols, cmask, norm_ptr, rstd, HAS_NORM, DT)
        wa = tl.load(w_ptr + rows_a[:, None] * stride_w + cols[None, :], mask=mask_a[:, None] & cmask[None, :], other=0.0)
        acc_a += contract(x, wa, USE_DOT)
        if PAIR:
            wb = tl.load(w_ptr + rows_b[:, None] * stride_w + cols[None, :], mask=mask_b[:, None] & cmask[None, :], other=0.0)
            acc_b += contract(x, wb, USE_DOT)
    return acc_a, acc_b


# ----------------------------------------------------------------------------- moe_front


@triton.jit
def moe_front_tile(tile,
                   x_ptr, stride_x, R, D, norm_ptr, eps,
                   router_ptr, E, logits_ptr, stride_lg,
                   down_ptr, W, moe_in_ptr, stride_in, moe_out_ptr, stride_out,
                   gate_up_ptr, S, act_ptr, stride_act, beta, linear_beta,
                   HAS_NORM: tl.constexpr, LATENT: tl.constexpr, HAS_SHARED: tl.constexpr, SITU: tl.constexpr,
                   BLOCK_R: tl.constexpr, BLOCK_NR: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   USE_DOT: tl.constexpr, NUM_STAGES: tl.constexpr):
    """One tile of moe_front (see the module docstring). x [R, D] model dtype; router [E, D] fp32;
    latent_down [W, D]; gate_up [2S, D] (gate rows 0..S-1, up rows S..2S-1); outputs as named.
    Tile order: router tiles, then latent/copy(+zero) tiles, then shared tiles."""
    DT: tl.constexpr = moe_in_ptr.dtype.element_ty
    r = tl.arange(0, BLOCK_R)
    rmask = r < R
    if HAS_NORM:
        rstd = row_rstd(x_ptr, stride_x, R, D, eps, DT, BLOCK_R, BLOCK_K)
    else:
        rstd = tl.full([BLOCK_R], 1.0, tl.float32)
    n_router = tl.cdiv(E, BLOCK_NR)
    n_mid = tl.cdiv(W, BLOCK_N)
    # (each branch names its own variables: Triton requires same-named values to agree in type at the join)
    if tile < n_router:
        lrows = tile * BLOCK_NR + tl.arange(0, BLOCK_NR)
        lmask = lrows < E
        logits, _ = gemv_rows(x_ptr, stride_x, rmask, D, norm_ptr, rstd, router_ptr, D, lrows, lmask, lrows, lmask,
                              HAS_NORM, False, DT, BLOCK_R, BLOCK_NR, BLOCK_K, USE_DOT, NUM_STAGES)
        tl.store(logits_ptr + r[:, None] * stride_lg + lrows[None, :], logits, mask=rmask[:, None] & lmask[None, :])
    elif tile < n_router + n_mid:
        cols = (tile - n_router) * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < W
        omask = rmask[:, None] & cmask[None, :]
        if LATENT:
            z, _ = gemv_rows(x_ptr, stride_x, rmask, D, norm_ptr, rstd, down_ptr, D, cols, cmask, cols, cmask,
                             HAS_NORM, False, DT, BLOCK_R, BLOCK_N, BLOCK_K, USE_DOT, NUM_STAGES)
            tl.store(moe_in_ptr + r[:, None] * stride_in + cols[None, :], z.to(DT), mask=omask)
        else:
            x = tl.load(x_ptr + r[:, None] * stride_x + cols[None, :], mask=omask, other=0.0)
            tl.store(moe_in_ptr + r[:, None] * stride_in + cols[None, :], normed_rows(x, cols, cmask, norm_ptr, rstd, HAS_NORM, DT), mask=omask)
        tl.store(moe_out_ptr + r[:, None] * stride_out + cols[None, :], tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32), mask=omask)
    elif HAS_SHARED:
        srows = (tile - n_router - n_mid) * BLOCK_N + tl.arange(0, BLOCK_N)
        smask = srows < S
        g, u = gemv_rows(x_ptr, stride_x, rmask, D, norm_ptr, rstd, gate_up_ptr, D, srows, smask, srows + S, smask,
                         HAS_NORM, True, DT, BLOCK_R, BLOCK_N, BLOCK_K, USE_DOT, NUM_STAGES)
        a = gated_act(g.to(DT).to(tl.float32), u.to(DT).to(tl.float32), SITU, beta, linear_beta)
        tl.store(act_ptr + r[:, None] * stride_act + srows[None, :], a.to(DT), mask=rmask[:, None] & smask[None, :])


@triton.jit
def moe_front_kernel(x_ptr, stride_x, R, D, norm_ptr, eps, router_ptr, E, logits_ptr, stride_lg,
                     down_ptr, W, moe_in_ptr, stride_in, moe_out_ptr, stride_out,
                     gate_up_ptr, S, act_ptr, stride_act, beta, linear_beta,
                     HAS_NORM: tl.constexpr, LATENT: tl.constexpr, HAS_SHARED: tl.constexpr, SITU: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_NR: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     USE_DOT: tl.constexpr, NUM_STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    moe_front_tile(tl.program_id(0), x_ptr, stride_x, R, D, norm_ptr, eps, router_ptr, E, logits_ptr, stride_lg,
                   down_ptr, W, moe_in_ptr, stride_in, moe_out_ptr, stride_out, gate_up_ptr, S, act_ptr, stride_act,
                   beta, linear_beta, HAS_NORM, LATENT, HAS_SHARED, SITU, BLOCK_R, BLOCK_NR, BLOCK_N, BLOCK_K, USE_DOT, NUM_STAGES)


# ----------------------------------------------------------------------------- moe_experts


@triton.jit
def _expert_dense(e64, chunk, r, live, p_rows, x_ptr, stride_x, out_ptr, stride_out, K, I,
                  w1_ptr, w3_ptr, w2_ptr, stride_w13_e, stride_w13_n, stride_w2_e, stride_w2_n, beta, linear_beta,
                  SITU: tl.constexpr, DT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr,
                  BLOCK_K: tl.constexpr, BLOCK_KO: tl.constexpr, USE_DOT: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Dense expert e, intermediate rows chunk·BLOCK_I..: gate/up GEMVs, activation, down split-K into out."""
    w1 = w1_ptr + e64 * stride_w13_e
    w3 = w3_ptr + e64 * stride_w13_e
    w2 = w2_ptr + e64 * stride_w2_e
    rows = chunk * BLOCK_I + tl.arange(0, BLOCK_I)
    nmask = rows < I
    g = tl.zeros([BLOCK_R, BLOCK_I], dtype=tl.float32)
    u = tl.zeros([BLOCK_R, BLOCK_I], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        cols = k0 + tl.arange(0, BLOCK_K)
        cmask = cols < K
        x = tl.load(x_ptr + r[:, None] * stride_x + cols[None, :], mask=live[:, None] & cmask[None, :], other=0.0)
        wmask = nmask[:, None] & cmask[None, :]
        g += contract(x, tl.load(w1 + rows[:, None] * stride_w13_n + cols[None, :], mask=wmask, other=0.0), USE_DOT)
        u += contract(x, tl.load(w3 + rows[:, None] * stride_w13_n + cols[None, :], mask=wmask, other=0.0), USE_DOT)
    a = gated_act(g.to(DT).to(tl.float32), u.to(DT).to(tl.float32), SITU, beta, linear_beta).to(DT)
    for o0 in tl.range(0, K, BLOCK_KO, num_stages=NUM_STAGES):
        outs = o0 + tl.arange(0, BLOCK_KO)
        omask = outs < K
        wd = tl.load(w2 + outs[:, None] * stride_w2_n + rows[None, :], mask=omask[:, None] & nmask[None, :], other=0.0)
        y = contract(a, wd, USE_DOT) * p_rows[:, None]
        tl.atomic_add(out_ptr + r[:, None] * stride_out + outs[None, :], y, mask=live[:, None] & omask[None, :], sem="relaxed")


@triton.jit
def _expert_mxfp4(e64, chunk, r, live, p_rows, x_ptr, stride_x, out_ptr, stride_out, K, I,
                  w1_ptr, w3_ptr, w2_ptr, s1_ptr, s3_ptr, s2_ptr,
                  stride_w13_e, stride_w13_n, stride_w2_e, stride_w2_n,
                  stride_s13_e, stride_s13_n, stride_s2_e, stride_s2_n, beta, linear_beta,
                  SITU: tl.constexpr, DT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr,
                  BLOCK_K: tl.constexpr, BLOCK_KO: tl.constexpr, USE_DOT: tl.constexpr, NUM_STAGES: tl.constexpr):
    """MXFP4 expert e: ``_expert_dense`` with weights decoded in registers. Each packed byte holds an
    (even, odd) element pair, so the gate/up GEMVs contract the byte's low nibbles with the even input
    elements and its high nibbles with the odd ones (no shuffle of weights); for the down GEMV the
    activation chunk is split once into its even / odd members to pair with W2's bytes the same way."""
    BKH: tl.constexpr = BLOCK_K // 2
    BIH: tl.constexpr = BLOCK_I // 2
    WDT: tl.constexpr = DT if USE_DOT else tl.float32  # decoded weights: tensor-core operands (exact) or fp32
    p1 = w1_ptr + e64 * stride_w13_e
    p3 = w3_ptr + e64 * stride_w13_e
    p2 = w2_ptr + e64 * stride_w2_e
    q1 = s1_ptr + e64 * stride_s13_e
    q3 = s3_ptr + e64 * stride_s13_e
    q2 = s2_ptr + e64 * stride_s2_e
    rows = chunk * BLOCK_I + tl.arange(0, BLOCK_I)
    nmask = rows < I
    kbytes = (K + 1) // 2
    g = tl.zeros([BLOCK_R, BLOCK_I], dtype=tl.float32)
    u = tl.zeros([BLOCK_R, BLOCK_I], dtype=tl.float32)
    xrow = x_ptr + r[:, None] * stride_x
    for kb0 in tl.range(0, kbytes, BKH, num_stages=NUM_STAGES):
        kb = kb0 + tl.arange(0, BKH)
        bmask = kb < kbytes
        xe = tl.load(xrow + (2 * kb)[None, :], mask=live[:, None] & (2 * kb < K)[None, :], other=0.0)
        xo = tl.load(xrow + (2 * kb + 1)[None, :], mask=live[:, None] & (2 * kb + 1 < K)[None, :], other=0.0)
        lo, hi = mxfp4_tile(p1, q1, stride_w13_n, stride_s13_n, rows, nmask, kb, bmask, WDT)
        g += contract_pair(xe, lo, xo, hi, USE_DOT)
        lo, hi = mxfp4_tile(p3, q3, stride_w13_n, stride_s13_n, rows, nmask, kb, bmask, WDT)
        u += contract_pair(xe, lo, xo, hi, USE_DOT)
    a = gated_act(g.to(DT).to(tl.float32), u.to(DT).to(tl.float32), SITU, beta, linear_beta).to(DT)
    ae, ao = tl.split(tl.reshape(a, [BLOCK_R, BIH, 2]))
    bcols = chunk * BIH + tl.arange(0, BIH)
    bmask2 = bcols < (I + 1) // 2
    for o0 in tl.range(0, K, BLOCK_KO, num_stages=NUM_STAGES):
        outs = o0 + tl.arange(0, BLOCK_KO)
        omask = outs < K
        lo, hi = mxfp4_tile(p2, q2, stride_w2_n, stride_s2_n, outs, omask, bcols, bmask2, WDT)
        y = contract_pair(ae, lo, ao, hi, USE_DOT) * p_rows[:, None]
        tl.atomic_add(out_ptr + r[:, None] * stride_out + outs[None, :], y, mask=live[:, None] & omask[None, :], sem="relaxed")


@triton.jit
def moe_experts_tile(task, num_tasks,
                     logits_ptr, stride_lg, bias_ptr, R, E, EG, top_k, topk_groups, scaling,
                     x_ptr, stride_x, out_ptr, stride_out, K, I, n_chunks,
                     w1_ptr, w3_ptr, w2_ptr, s1_ptr, s3_ptr, s2_ptr,
                     stride_w13_e, stride_w13_n, stride_w2_e, stride_w2_n,
                     stride_s13_e, stride_s13_n, stride_s2_e, stride_s2_n, beta, linear_beta,
                     SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr, GROUPED: tl.constexpr,
                     MXFP4: tl.constexpr, SITU: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_EG: tl.constexpr, BLOCK_TOPK: tl.constexpr,
                     BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_KO: tl.constexpr,
                     USE_DOT: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Task ``task`` of ``num_tasks`` of moe_experts: route once, then work items t = task, task +
    num_tasks, .. < n_distinct·n_chunks, item t = (slot, chunk) = divmod(t, n_chunks): the slot-th
    distinct selected expert (id order), intermediate rows chunk·BLOCK_I ... Consecutive tasks take
    consecutive items, so the experts stream in routing order, each chunk once for all its rows.

    logits [R, E] fp32, bias [E]; x = moe_in [R, K]; out = moe_out [R, K] fp32 (zeroed by moe_front,
    accumulated with atomics). Dense: w1/w3 [E, I, K], w2 [E, K, I] (s* unused). MXFP4: w* are the
    packed uint8 [E, N, ceil(cols/2)] and s* the E8M0 scales [E, N, ceil(cols/32)]."""
    DT: tl.constexpr = x_ptr.dtype.element_ty
    present, ids, sel_id, sel_w = route_summary(logits_ptr, stride_lg, bias_ptr, R, E, EG, top_k, topk_groups, scaling,
                                                SOFTMAX, RENORM, HAS_BIAS, GROUPED, BLOCK_R, BLOCK_G, BLOCK_EG, BLOCK_TOPK)
    n_items = tl.sum(present, axis=0) * n_chunks
    r = tl.arange(0, BLOCK_R)
    for t in range(task, n_items, num_tasks):
        expert, p_rows = slot_expert(present, ids, sel_id, sel_w, t // n_chunks)
        chunk = t % n_chunks
        live = (r < R) & (p_rows != 0.0)
        e64 = expert.to(tl.int64)
        if MXFP4:
            _expert_mxfp4(e64, chunk, r, live, p_rows, x_ptr, stride_x, out_ptr, stride_out, K, I,
                          w1_ptr, w3_ptr, w2_ptr, s1_ptr, s3_ptr, s2_ptr, stride_w13_e, stride_w13_n, stride_w2_e, stride_w2_n,
                          stride_s13_e, stride_s13_n, stride_s2_e, stride_s2_n, beta, linear_beta,
                          SITU, DT, BLOCK_R, BLOCK_I, BLOCK_K, BLOCK_KO, USE_DOT, NUM_STAGES)
        else:
            _expert_dense(e64, chunk, r, live, p_rows, x_ptr, stride_x, out_ptr, stride_out, K, I,
                          w1_ptr, w3_ptr, w2_ptr, stride_w13_e, stride_w13_n, stride_w2_e, stride_w2_n, beta, linear_beta,
                          SITU, DT, BLOCK_R, BLOCK_I, BLOCK_K, BLOCK_KO, USE_DOT, NUM_STAGES)


@triton.jit
def moe_experts_kernel(logits_ptr, stride_lg, bias_ptr, R, E, EG, top_k, topk_groups, scaling,
                       x_ptr, stride_x, out_ptr, stride_out, K, I, n_chunks,
                       w1_ptr, w3_ptr, w2_ptr, s1_ptr, s3_ptr, s2_ptr,
                       stride_w13_e, stride_w13_n, stride_w2_e, stride_w2_n,
                       stride_s13_e, stride_s13_n, stride_s2_e, stride_s2_n, beta, linear_beta,
                       SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr, GROUPED: tl.constexpr,
                       MXFP4: tl.constexpr, SITU: tl.constexpr,
                       BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_EG: tl.constexpr, BLOCK_TOPK: tl.constexpr,
                       BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_KO: tl.constexpr,
                       USE_DOT: tl.constexpr, NUM_STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    moe_experts_tile(tl.program_id(0), tl.num_programs(0), logits_ptr, stride_lg, bias_ptr, R, E, EG, top_k, topk_groups, scaling,
                     x_ptr, stride_x, out_ptr, stride_out, K, I, n_chunks, w1_ptr, w3_ptr, w2_ptr, s1_ptr, s3_ptr, s2_ptr,
                     stride_w13_e, stride_w13_n, stride_w2_e, stride_w2_n, stride_s13_e, stride_s13_n, stride_s2_e, stride_s2_n,
                     beta, linear_beta, SOFTMAX, RENORM, HAS_BIAS, GROUPED, MXFP4, SITU,
                     BLOCK_R, BLOCK_G, BLOCK_EG, BLOCK_TOPK, BLOCK_I, BLOCK_K, BLOCK_KO, USE_DOT, NUM_STAGES)


# ----------------------------------------------------------------------------- moe_tail


@triton.jit
def moe_tail_tile(tile,
                  u_ptr, stride_u, R, L, norm_ptr, eps, up_ptr,
                  act_ptr, stride_act, S, down_ptr,
                  tgt_ptr, stride_t, D,
                  LATENT: tl.constexpr, LATENT_NORM: tl.constexpr, HAS_SHARED: tl.constexpr, ACCUMULATE: tl.constexpr,
                  DT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  USE_DOT: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Output columns tile·BLOCK_N.. of target [R, D]: (+)= W↑[cols] RMSNorm(u as DT) (LATENT; u itself
    otherwise) + W_sd[cols] act. u = moe_out [R, L] fp32; up [D, L]; act [R, S]; down [D, S].
    The twin's roundings to DT (u, each projection, their sum) are reproduced."""
    r = tl.arange(0, BLOCK_R)
    rmask = r < R
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = cols < D
    omask = rmask[:, None] & nmask[None, :]
    if LATENT:
        if LATENT_NORM:
            rstd = row_rstd(u_ptr, stride_u, R, L, eps, DT, BLOCK_R, BLOCK_K)
        else:
            rstd = tl.full([BLOCK_R], 1.0, tl.float32)
        y, _ = gemv_rows(u_ptr, stride_u, rmask, L, norm_ptr, rstd, up_ptr, L, cols, nmask, cols, nmask,
                         LATENT_NORM, False, DT, BLOCK_R, BLOCK_N, BLOCK_K, USE_DOT, NUM_STAGES)
        y = y.to(DT).to(tl.float32)
    else:
        y = tl.load(u_ptr + r[:, None] * stride_u + cols[None, :], mask=omask, other=0.0).to(DT).to(tl.float32)
    if HAS_SHARED:
        ones = tl.full([BLOCK_R], 1.0, tl.float32)
        sh, _ = gemv_rows(act_ptr, stride_act, rmask, S, norm_ptr, ones, down_ptr, S, cols, nmask, cols, nmask,
                          False, False, DT, BLOCK_R, BLOCK_N, BLOCK_K, USE_DOT, NUM_STAGES)
        y = (y + sh.to(DT).to(tl.float32)).to(DT).to(tl.float32)
    tptr = tgt_ptr + r[:, None] * stride_t + cols[None, :]
    if ACCUMULATE:
        y = tl.load(tptr, mask=omask, other=0.0).to(tl.float32) + y
    tl.store(tptr, y.to(tgt_ptr.dtype.element_ty), mask=omask)


@triton.jit
def moe_tail_kernel(u_ptr, stride_u, R, L, norm_ptr, eps, up_ptr, act_ptr, stride_act, S, down_ptr, tgt_ptr, stride_t, D,
                    LATENT: tl.constexpr, LATENT_NORM: tl.constexpr, HAS_SHARED: tl.constexpr, ACCUMULATE: tl.constexpr,
                    DT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    USE_DOT: tl.constexpr, NUM_STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    moe_tail_tile(tl.program_id(0), u_ptr, stride_u, R, L, norm_ptr, eps, up_ptr, act_ptr, stride_act, S, down_ptr,
                  tgt_ptr, stride_t, D, LATENT, LATENT_NORM, HAS_SHARED, ACCUMULATE, DT, BLOCK_R, BLOCK_N, BLOCK_K, USE_DOT, NUM_STAGES)


# ----------------------------------------------------------------------------- launch configuration


def use_dot(rows: int) -> bool:
    if FORCE_DOT is not None:
        return FORCE_DOT
    return not INTERPRET and rows >= DOT_MIN_ROWS


def rows_block(rows: int, dot: bool) -> int:
    return max(16, triton.next_power_of_2(rows)) if dot else triton.next_power_of_2(max(rows, 1))


def k_block(block_r: int, block_n: int, k: int, dot: bool, budget: int = 8192) -> int:
    """Reduction chunk: the broadcast products [BLOCK_R, BLOCK_N, BLOCK_K] of one step stay <= budget fp32
    (8192 = 64 registers a thread at 4 warps) on a GPU; the interpreter takes whole tiny rows (fewer,
    larger numpy steps)."""
    if INTERPRET:
        return max(16, min(INTERPRET_BLOCKS["k"], triton.next_power_of_2(k)))
    if dot:
        return 64
    return max(16, min(256, budget // (block_r * block_n)))


NUM_STAGES = 1 if INTERPRET else 3
NUM_WARPS = 4
_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _check_rows(*tensors: torch.Tensor) -> None:
    for t in tensors:
        assert t.stride(-1) == 1, "kernels need unit column stride"


# ----------------------------------------------------------------------------- launches


def launch_moe_front(op, env) -> None:
    a, w = op.attrs, op.weights
    x = env.buf[op.reads[0]]
    logits, moe_in, moe_out = env.buf["moe_logits"], env.buf["moe_in"], env.buf["moe_out"]
    R, D = x.shape
    router = w["router"]
    E = router.shape[0]
    W = moe_in.shape[1]
    latent = "latent_down" in w
    shared = "shared_gate_up" in w
    S = a["shared_width"] if shared else 0
    act = env.buf["moe_shared_act"] if shared else moe_in
    down = w["latent_down"] if latent else router
    gate_up = w["shared_gate_up"] if shared else router
    norm = w.get("norm", router)
    _check_rows(x, router, down, gate_up, logits, moe_in, moe_out, act)
    dot = use_dot(R)
    BR = rows_block(R, dot)
    BN = 32 if not INTERPRET else INTERPRET_BLOCKS["n"]
    BNR = BN // 2 if not INTERPRET else BN  # fp32 router rows: half as many per tile, same bytes
    if dot:
        BN = BNR = max(BN, 16)
    BK = k_block(BR, BN, D, dot, budget=4096)  # shared tiles hold two products (gate and up)
    grid = (triton.cdiv(E, BNR) + triton.cdiv(W, BN) + (triton.cdiv(S, BN) if shared else 0),)
    moe_front_kernel[grid](
        x, x.stride(0), R, D, norm, a["eps"], router, E, logits, logits.stride(0),
        down, W, moe_in, moe_in.stride(0), moe_out, moe_out.stride(0),
        gate_up, S, act, act.stride(0), a.get("beta", 4.0), a.get("linear_beta", 25.0),
        HAS_NORM="norm" in w, LATENT=latent, HAS_SHARED=shared, SITU=a.get("act") == "situ",
        BLOCK_R=BR, BLOCK_NR=BNR, BLOCK_N=BN, BLOCK_K=BK, USE_DOT=dot, NUM_STAGES=NUM_STAGES, num_warps=NUM_WARPS,
        **pdl_launch_args(env))


def expert_blocks(rows: int, k: int, intermediate: int, mxfp4: bool, dot: bool) -> dict:
    """BLOCK_I (intermediate rows per work item), BLOCK_K (input chunk of the gate/up GEMVs, elements),
    BLOCK_KO (output chunk of the down GEMV). GPU sizes keep each broadcast product <= 4096 fp32 per
    weight tile (32 registers a thread at 4 warps); chosen so ptxas (sm_90) reports no or few spills."""
    br = rows_block(rows, dot)
    if INTERPRET:
        b = INTERPRET_BLOCKS
        return dict(BLOCK_I=max(16, min(b["i"], triton.next_power_of_2(intermediate))), BLOCK_K=max(16, min(b["k"], triton.next_power_of_2(k))), BLOCK_KO=max(16, min(32, b["k"])))
    if dot:
        return dict(BLOCK_I=64, BLOCK_K=64, BLOCK_KO=32)
    bi = 64
    if mxfp4:  # decoded even/odd tiles + their products: half the dense budget per byte column
        return dict(BLOCK_I=bi, BLOCK_K=2 * max(16, 2048 // (br * bi)), BLOCK_KO=max(16, min(64, 4096 // (br * bi // 2))))
    return dict(BLOCK_I=bi, BLOCK_K=max(16, 4096 // (br * bi)), BLOCK_KO=max(16, min(64, 4096 // (br * bi))))


def expert_programs(work_items: int, device: torch.device) -> int:
    """Programs of the persistent moe_experts launch: 2 per SM on a GPU (each routes once, then strides
    over the work items); two in the interpreter (programs run one after another there; two still
    exercise the stride)."""
    if INTERPRET or device.type != "cuda":
        return max(1, min(work_items, 2))
    return max(1, min(work_items, 2 * torch.cuda.get_device_properties(device).multi_processor_count))


def launch_moe_experts(op, env) -> None:
    a, w = op.attrs, op.weights
    mc = a["moe"]
    logits, x, out = env.buf["moe_logits"], env.buf["moe_in"], env.buf[op.writes[0]]
    R, K = x.shape
    E, I = mc.num_experts, mc.intermediate_size
    mxfp4 = a["expert_format"] == "mxfp4"
    if mxfp4:
        w1, w3, w2 = w["w1_packed"], w["w3_packed"], w["w2_packed"]
        s1, s3, s2 = w["w1_scale"], w["w3_scale"], w["w2_scale"]
    else:
        w1, w3, w2 = w["w1"], w["w3"], w["w2"]
        s1 = s3 = s2 = w1
    assert w1.stride() == w3.stride() and s1.stride() == s3.stride()
    _check_rows(logits, x, out, w1, w3, w2, s1, s2)
    bias = w.get("bias")
    dot = use_dot(R)
    blocks = expert_blocks(R, K, I, mxfp4, dot)
    route = routing_blocks(R, E, mc.num_groups, mc.top_k)
    route["BLOCK_R"] = rows_block(R, dot)
    n_chunks = triton.cdiv(I, blocks["BLOCK_I"])
    grid = (expert_programs(min(E, R * mc.top_k) * n_chunks, x.device),)
    moe_experts_kernel[grid](
        logits, logits.stride(0), bias if bias is not None else logits, R, E, E // mc.num_groups, mc.top_k, mc.topk_groups,
        float(mc.routed_scaling_factor), x, x.stride(0), out, out.stride(0), K, I, n_chunks,
        w1, w3, w2, s1, s3, s2, w1.stride(0), w1.stride(1), w2.stride(0), w2.stride(1),
        s1.stride(0), s1.stride(1), s2.stride(0), s2.stride(1), a.get("beta", 4.0), a.get("linear_beta", 25.0),
        SOFTMAX=mc.scoring == "softmax", RENORM=mc.renormalize, HAS_BIAS=bias is not None, GROUPED=mc.num_groups > 1,
        MXFP4=mxfp4, SITU=a.get("act") == "situ", **route, **blocks, USE_DOT=dot, NUM_STAGES=NUM_STAGES, num_warps=NUM_WARPS,
        **pdl_launch_args(env))


def launch_moe_tail(op, env) -> None:
    a, w = op.attrs, op.weights
    u, moe_in, tgt = env.buf["moe_out"], env.buf["moe_in"], env.buf[op.writes[0]]
    R, L = u.shape
    D = tgt.shape[1]
    latent = "latent_up" in w
    shared = "shared_down" in w
    act = env.buf["moe_shared_act"] if shared else u
    up = w["latent_up"] if latent else u
    down = w["shared_down"] if shared else u
    norm = w.get("latent_norm", u)
    _check_rows(u, tgt, act, up, down)
    dot = use_dot(R)
    BR = rows_block(R, dot)
    BN = INTERPRET_BLOCKS["n"] if INTERPRET else 32
    BK = k_block(BR, BN, max(L, act.shape[1]), dot)
    grid = (triton.cdiv(D, BN),)
    moe_tail_kernel[grid](
        u, u.stride(0), R, L, norm, a["eps"], up, act, act.stride(0), act.shape[1] if shared else 0, down,
        tgt, tgt.stride(0), D,
        LATENT=latent, LATENT_NORM="latent_norm" in w, HAS_SHARED=shared, ACCUMULATE=a.get("accumulate", False),
        DT=_DTYPES[moe_in.dtype], BLOCK_R=BR, BLOCK_N=BN, BLOCK_K=BK, USE_DOT=dot, NUM_STAGES=NUM_STAGES, num_warps=NUM_WARPS,
        **pdl_launch_args(env))


KERNELS = {"moe_front": launch_moe_front, "moe_experts": launch_moe_experts, "moe_tail": launch_moe_tail}
