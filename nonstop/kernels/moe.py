"""MoE super-op kernels: ``moe_front``, ``moe_experts``, ``moe_tail`` (twins in ``program/reference.py``).

A MoE layer of a step of R rows (x [R, d] the FFN input, ℓ the expert width: K3's latent, else d):

moe_front   one pass over [router (fp32, E×d) | latent_down (ℓ×d) | shared gate/up (2S×d)], all reading
            xn = RMSNorm(x) (recomputed per tile):
              moe_logits [R, E] fp32 = xn·W_rᵀ;  moe_in [R, ℓ] = xn·W↓ᵀ (latent) or xn;
              moe_shared_act [R, S] = act(xn·W_sgᵀ, xn·W_suᵀ);  moe_out [R, ℓ] fp32 = 0 (the twin's).
            Tiles: ceil(E/BLOCK_NR) router tiles, ceil(ℓ/BLOCK_N) latent (or copy) tiles that also zero
            their columns of moe_out, ceil(S/BLOCK_N) shared tiles (gate rows n and up rows S+n).
moe_experts two phases (``launch.py``), no atomics, so the result does not depend on scheduling:
            1 ``gate_up`` - P persistent programs (2 per SM): each selects the experts from moe_logits
              (``moe_routing``), then strides over the work items (slot, chunk): the slot-th distinct
              selected expert e (id order) and its intermediate rows chunk·BLOCK_I .. +BLOCK_I:
              act[slot] = glu(z·W1[e, chunk]ᵀ, z·W3[e, chunk]ᵀ) for every row, into a scratch
              [slots·R, I] (model dtype); program 0 also writes each slot's expert and row weights.
              Every selected expert's gate/up weights are read once per step, in routing order.
            2 ``down`` - tiles of BLOCK_NO output columns of moe_out: for each slot in order,
              y = act[slot] · W2[e][cols]ᵀ over the whole intermediate width, rounded to the model dtype
              (the twin's F.linear), then moe_out[:, cols] += p[slot, r] · y in fp32 - the twin's sum in the
              twin's order (experts in id order) - and the total rounded to the model dtype as the twin's.
            Dense experts or MXFP4 (``gemv.py``: decoded in registers from 16-byte loads).
moe_tail    target (+)= W↑ RMSNorm(moe_out as DT) (latent; plain moe_out otherwise) + W_sd moe_shared_act.
            Tiles over BLOCK_N output columns of d; each recomputes the latent norm of its rows.
"""

from __future__ import annotations

from types import MappingProxyType

import torch
import triton
import triton.language as tl

from nonstop.kernels.activations import act_code, glu_tile
from nonstop.kernels.gemv import gemv_rows, pick_block_n, rms_apply, row_inv_rms
from nonstop.kernels.launch import (
    launcher,
    pdl_launch_args,
    phase_counters,
    phase_done,
    phase_ticket,
    require_unit_columns,
    workspace,
)
from nonstop.kernels.moe_routing import route_summary, routing_blocks, slot_expert
from nonstop.kernels.platform import (
    MAX_REGISTERS,
    interpreting,
    num_sms,
    pipeline_stages,
    pow2,
    row_block,
    upcast_dots,
    wide_load_k,
)

NUM_WARPS = 4
EXPERT_WARPS = 8
# interpreter block sizes: large (whole tiny rows, few numpy steps); tests shrink them to get many tiles,
# several K steps and ragged last chunks out of the tiny configs
INTERPRET_BLOCKS = MappingProxyType({"n": 64, "k": 128, "i": 64})  # read-only: candidates import it
_DTYPES = MappingProxyType({torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16})


# ----------------------------------------------------------------------------- moe_front


@triton.jit
def moe_front_tile(
    tile,
    x_ptr,
    stride_x,
    R,
    D,
    norm_ptr,
    eps,
    router_ptr,
    E,
    logits_ptr,
    stride_lg,
    down_ptr,
    W,
    moe_in_ptr,
    stride_in,
    moe_out_ptr,
    stride_out,
    gate_up_ptr,
    S,
    act_ptr,
    stride_act,
    beta,
    linear_beta,
    HAS_NORM: tl.constexpr,
    LATENT: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_NR: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """One tile of moe_front (see the module docstring). x [R, D] model dtype; router [E, D] fp32;
    latent_down [W, D]; gate_up [2S, D] (gate rows 0..S-1, up rows S..2S-1); outputs as named.
    Tile order: router tiles, then latent/copy(+zero) tiles, then shared tiles."""
    DT: tl.constexpr = moe_in_ptr.dtype.element_ty
    r = tl.arange(0, BLOCK_R)
    rmask = r < R
    if HAS_NORM:
        rstd = row_inv_rms(x_ptr, stride_x, R, D, eps, DT, BLOCK_R, BLOCK_K)
    else:
        rstd = tl.full([BLOCK_R], 1.0, tl.float32)
    n_router = tl.cdiv(E, BLOCK_NR)
    n_mid = tl.cdiv(W, BLOCK_N)
    # (each branch names its own variables: Triton requires same-named values to agree in type at the join)
    if tile < n_router:
        lrows = tile * BLOCK_NR + tl.arange(0, BLOCK_NR)
        lmask = lrows < E
        logits, _ = gemv_rows(
            x_ptr,
            stride_x,
            R,
            0,
            D,
            norm_ptr,
            rstd,
            router_ptr,
            router_ptr,
            D,
            router_ptr,
            router_ptr,
            0,
            0,
            lrows,
            lrows,
            lmask,
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
        tl.store(logits_ptr + r[:, None] * stride_lg + lrows[None, :], logits, mask=rmask[:, None] & lmask[None, :])
    elif tile < n_router + n_mid:
        cols = (tile - n_router) * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < W
        omask = rmask[:, None] & cmask[None, :]
        if LATENT:
            z, _ = gemv_rows(
                x_ptr,
                stride_x,
                R,
                0,
                D,
                norm_ptr,
                rstd,
                down_ptr,
                down_ptr,
                D,
                down_ptr,
                down_ptr,
                0,
                0,
                cols,
                cols,
                cmask,
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
            tl.store(moe_in_ptr + r[:, None] * stride_in + cols[None, :], z.to(DT), mask=omask)
        else:
            x = tl.load(x_ptr + r[:, None] * stride_x + cols[None, :], mask=omask, other=0.0)
            if HAS_NORM:
                xn = rms_apply(x, rstd, tl.load(norm_ptr + cols, mask=cmask, other=0.0), DT)
            else:
                xn = x.to(DT)
            tl.store(moe_in_ptr + r[:, None] * stride_in + cols[None, :], xn, mask=omask)
        tl.store(
            moe_out_ptr + r[:, None] * stride_out + cols[None, :],
            tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32),
            mask=omask,
        )
    elif HAS_SHARED:
        srows = (tile - n_router - n_mid) * BLOCK_N + tl.arange(0, BLOCK_N)
        smask = srows < S
        g, u = gemv_rows(
            x_ptr,
            stride_x,
            R,
            0,
            D,
            norm_ptr,
            rstd,
            gate_up_ptr,
            gate_up_ptr,
            D,
            gate_up_ptr,
            gate_up_ptr,
            0,
            0,
            srows,
            srows + S,
            smask,
            HAS_NORM,
            True,
            False,
            DT,
            BLOCK_R,
            BLOCK_K,
            USE_DOT,
            UPCAST,
            NUM_STAGES,
        )
        a = glu_tile(g.to(DT).to(tl.float32), u.to(DT).to(tl.float32), ACT, beta, linear_beta, DT)
        tl.store(act_ptr + r[:, None] * stride_act + srows[None, :], a, mask=rmask[:, None] & smask[None, :])


moe_front_kernel = launcher(moe_front_tile)


# ----------------------------------------------------------------------------- moe_experts


@triton.jit
def moe_gate_up_tile(
    task,
    num_tasks,
    logits_ptr,
    stride_lg,
    bias_ptr,
    R,
    E,
    EG,
    top_k,
    topk_groups,
    scaling,
    x_ptr,
    stride_x,
    K,
    I,
    n_chunks,
    slots,
    act_ptr,
    ids_ptr,
    p_ptr,
    w1_ptr,
    w3_ptr,
    s1_ptr,
    s3_ptr,
    stride_w13_e,
    stride_w13_n,
    stride_s13_e,
    stride_s13_n,
    KB13,
    beta,
    linear_beta,
    SOFTMAX: tl.constexpr,
    RENORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GROUPED: tl.constexpr,
    MXFP4: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_EG: tl.constexpr,
    BLOCK_TOPK: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """Phase 1, task ``task`` of ``num_tasks``: route, then items t = task, task + num_tasks, .. <
    n_distinct·n_chunks, item t = (slot, chunk) = divmod(t, n_chunks): act[slot·R + r, chunk cols] =
    glu(z W1[e, chunk]ᵀ, z W3[e, chunk]ᵀ) for every row r. Task 0 also writes ids[slot] (expert, -1 past
    the distinct ones) and p[slot, r] (row r's weight for it, 0 if it did not choose it), slot < slots.
    logits [R, E] fp32, bias [E]; x = moe_in [R, K]. Dense: w1/w3 [E, I, K]. MXFP4: the packed uint8
    [E, I, KB13] and the E8M0 scales [E, I, ceil(K/32)] (s1/s3)."""
    DT: tl.constexpr = x_ptr.dtype.element_ty
    present, ids, sel_id, sel_w = route_summary(
        logits_ptr,
        stride_lg,
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
    n_distinct = tl.sum(present, axis=0)
    r = tl.arange(0, BLOCK_R)
    if task == 0:
        for s in range(0, slots):
            expert, p_rows = slot_expert(present, ids, sel_id, sel_w, s)
            tl.store(ids_ptr + s, tl.where(s < n_distinct, expert, -1))
            tl.store(p_ptr + s * BLOCK_R + r, tl.where(s < n_distinct, p_rows, 0.0))
    ones = tl.full([BLOCK_R], 1.0, tl.float32)
    for t in range(task, n_distinct * n_chunks, num_tasks):
        slot = t // n_chunks
        expert, _ = slot_expert(present, ids, sel_id, sel_w, slot)
        e64 = expert.to(tl.int64)
        rows = (t % n_chunks) * BLOCK_I + tl.arange(0, BLOCK_I)
        nmask = rows < I
        g, u = gemv_rows(
            x_ptr,
            stride_x,
            R,
            0,
            K,
            x_ptr,
            ones,
            w1_ptr + e64 * stride_w13_e,
            w3_ptr + e64 * stride_w13_e,
            stride_w13_n,
            s1_ptr + e64 * stride_s13_e,
            s3_ptr + e64 * stride_s13_e,
            stride_s13_n,
            KB13,
            rows,
            rows,
            nmask,
            False,
            True,
            MXFP4,
            DT,
            BLOCK_R,
            BLOCK_K,
            USE_DOT,
            UPCAST,
            NUM_STAGES,
        )
        a = glu_tile(g.to(DT).to(tl.float32), u.to(DT).to(tl.float32), ACT, beta, linear_beta, DT)
        dest = act_ptr + (slot * R + r)[:, None].to(tl.int64) * I + rows[None, :]
        tl.store(dest, a, mask=(r < R)[:, None] & nmask[None, :])


@triton.jit
def moe_down_tile(
    tile,
    R,
    K,
    I,
    slots,
    act_ptr,
    ids_ptr,
    p_ptr,
    out_ptr,
    stride_out,
    w2_ptr,
    s2_ptr,
    stride_w2_e,
    stride_w2_n,
    stride_s2_e,
    stride_s2_n,
    KB2,
    MXFP4: tl.constexpr,
    DT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_NO: tl.constexpr,
    BLOCK_KI: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """Phase 2, output columns tile·BLOCK_NO ..: moe_out[:, cols] += (Σ_slot p[slot] · (act[slot] W2[e][cols]ᵀ
    rounded to DT)).to(DT), slots in order (a fixed fp32 summation order). w2 [E, K, I] (dense) or the
    packed [E, K, KB2] with scales s2 [E, K, ceil(I/32)]."""
    r = tl.arange(0, BLOCK_R)
    cols = tile * BLOCK_NO + tl.arange(0, BLOCK_NO)
    cmask = cols < K
    ones = tl.full([BLOCK_R], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_NO], dtype=tl.float32)
    for s in range(0, slots):
        expert = tl.load(ids_ptr + s)
        if expert >= 0:
            e64 = expert.to(tl.int64)
            y, _ = gemv_rows(
                act_ptr + (s * R).to(tl.int64) * I,
                I,
                R,
                0,
                I,
                act_ptr,
                ones,
                w2_ptr + e64 * stride_w2_e,
                w2_ptr + e64 * stride_w2_e,
                stride_w2_n,
                s2_ptr + e64 * stride_s2_e,
                s2_ptr + e64 * stride_s2_e,
                stride_s2_n,
                KB2,
                cols,
                cols,
                cmask,
                False,
                False,
                MXFP4,
                DT,
                BLOCK_R,
                BLOCK_KI,
                USE_DOT,
                UPCAST,
                NUM_STAGES,
            )
            p_rows = tl.load(p_ptr + s * BLOCK_R + r)
            acc += p_rows[:, None] * y.to(DT).to(tl.float32)
    out_ptrs = out_ptr + r[:, None] * stride_out + cols[None, :]
    out_mask = (r < R)[:, None] & cmask[None, :]
    tl.store(out_ptrs, tl.load(out_ptrs, mask=out_mask, other=0.0) + acc.to(DT).to(tl.float32), mask=out_mask)


@triton.jit
def moe_experts_tile(
    tile,
    counters_ptr,
    n_gate_up,
    n_down,
    logits_ptr,
    stride_lg,
    bias_ptr,
    R,
    E,
    EG,
    top_k,
    topk_groups,
    scaling,
    x_ptr,
    stride_x,
    out_ptr,
    stride_out,
    K,
    I,
    n_chunks,
    slots,
    act_ptr,
    ids_ptr,
    p_ptr,
    w1_ptr,
    w3_ptr,
    w2_ptr,
    s1_ptr,
    s3_ptr,
    s2_ptr,
    stride_w13_e,
    stride_w13_n,
    stride_w2_e,
    stride_w2_n,
    stride_s13_e,
    stride_s13_n,
    stride_s2_e,
    stride_s2_n,
    KB13,
    KB2,
    beta,
    linear_beta,
    SOFTMAX: tl.constexpr,
    RENORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GROUPED: tl.constexpr,
    MXFP4: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_EG: tl.constexpr,
    BLOCK_TOPK: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_NO: tl.constexpr,
    BLOCK_KI: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PHASE: tl.constexpr,
):
    """The routed experts in two phases (module docstring): 1 ``moe_gate_up_tile`` (n_gate_up programs),
    2 ``moe_down_tile`` (n_down tiles); 0 the in-launch protocol (counters int32 [3])."""
    phase = PHASE
    if PHASE == 0:
        phase, tile = phase_ticket(counters_ptr, n_gate_up)
    if phase == 1:
        moe_gate_up_tile(
            tile,
            n_gate_up,
            logits_ptr,
            stride_lg,
            bias_ptr,
            R,
            E,
            EG,
            top_k,
            topk_groups,
            scaling,
            x_ptr,
            stride_x,
            K,
            I,
            n_chunks,
            slots,
            act_ptr,
            ids_ptr,
            p_ptr,
            w1_ptr,
            w3_ptr,
            s1_ptr,
            s3_ptr,
            stride_w13_e,
            stride_w13_n,
            stride_s13_e,
            stride_s13_n,
            KB13,
            beta,
            linear_beta,
            SOFTMAX,
            RENORM,
            HAS_BIAS,
            GROUPED,
            MXFP4,
            ACT,
            BLOCK_R,
            BLOCK_G,
            BLOCK_EG,
            BLOCK_TOPK,
            BLOCK_I,
            BLOCK_K,
            USE_DOT,
            UPCAST,
            NUM_STAGES,
        )
    else:
        moe_down_tile(
            tile,
            R,
            K,
            I,
            slots,
            act_ptr,
            ids_ptr,
            p_ptr,
            out_ptr,
            stride_out,
            w2_ptr,
            s2_ptr,
            stride_w2_e,
            stride_w2_n,
            stride_s2_e,
            stride_s2_n,
            KB2,
            MXFP4,
            x_ptr.dtype.element_ty,
            BLOCK_R,
            BLOCK_NO,
            BLOCK_KI,
            USE_DOT,
            UPCAST,
            NUM_STAGES,
        )
    if PHASE == 0:
        phase_done(counters_ptr, phase, n_down)


moe_experts_kernel = launcher(moe_experts_tile, phases=("gate_up", "down"), first="n_gate_up")


# ----------------------------------------------------------------------------- moe_tail


@triton.jit
def moe_tail_tile(
    tile,
    u_ptr,
    stride_u,
    R,
    L,
    norm_ptr,
    eps,
    up_ptr,
    act_ptr,
    stride_act,
    S,
    down_ptr,
    tgt_ptr,
    stride_t,
    D,
    LATENT: tl.constexpr,
    LATENT_NORM: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    DT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """Output columns tile·BLOCK_N.. of target [R, D]: (+)= W↑[cols] RMSNorm(u as DT) (LATENT; u itself
    otherwise) + W_sd[cols] act. u = moe_out [R, L] fp32; up [D, L]; act [R, S]; down [D, S].
    The twin's roundings to DT (u, each projection, their sum) are reproduced."""
    r = tl.arange(0, BLOCK_R)
    rmask = r < R
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = cols < D
    omask = rmask[:, None] & nmask[None, :]
    ones = tl.full([BLOCK_R], 1.0, tl.float32)
    if LATENT:
        if LATENT_NORM:
            rstd = row_inv_rms(u_ptr, stride_u, R, L, eps, DT, BLOCK_R, BLOCK_K)
        else:
            rstd = ones
        y, _ = gemv_rows(
            u_ptr,
            stride_u,
            R,
            0,
            L,
            norm_ptr,
            rstd,
            up_ptr,
            up_ptr,
            L,
            up_ptr,
            up_ptr,
            0,
            0,
            cols,
            cols,
            nmask,
            LATENT_NORM,
            False,
            False,
            DT,
            BLOCK_R,
            BLOCK_K,
            USE_DOT,
            UPCAST,
            NUM_STAGES,
        )
        y = y.to(DT).to(tl.float32)
    else:
        y = tl.load(u_ptr + r[:, None] * stride_u + cols[None, :], mask=omask, other=0.0).to(DT).to(tl.float32)
    if HAS_SHARED:
        sh, _ = gemv_rows(
            act_ptr,
            stride_act,
            R,
            0,
            S,
            norm_ptr,
            ones,
            down_ptr,
            down_ptr,
            S,
            down_ptr,
            down_ptr,
            0,
            0,
            cols,
            cols,
            nmask,
            False,
            False,
            False,
            DT,
            BLOCK_R,
            BLOCK_K,
            USE_DOT,
            UPCAST,
            NUM_STAGES,
        )
        y = (y + sh.to(DT).to(tl.float32)).to(DT).to(tl.float32)
    tptr = tgt_ptr + r[:, None] * stride_t + cols[None, :]
    if ACCUMULATE:
        y = tl.load(tptr, mask=omask, other=0.0).to(tl.float32) + y
    tl.store(tptr, y.to(tgt_ptr.dtype.element_ty), mask=omask)


moe_tail_kernel = launcher(moe_tail_tile, prefetch=("up_ptr", "pid * BLOCK_N * L", "BLOCK_N * L"))


# ----------------------------------------------------------------------------- launch configuration


def k_block(block_r: int, block_n: int, k: int, dot: bool, budget: int = 8192) -> int:
    """Reduction chunk: the FMA products [BLOCK_R, BLOCK_N, BLOCK_K] of one step stay <= budget fp32 (8192 =
    64 registers a thread at 4 warps) on a GPU; the mma path takes 64, or more where a [BLOCK_N, 64] weight
    tile would leave the threads of 8 warps (the megakernel's) under one 16-byte load each
    (``platform.wide_load_k``); the interpreter takes whole tiny rows (fewer, larger numpy steps)."""
    if interpreting():
        return max(16, min(INTERPRET_BLOCKS["k"], pow2(k)))
    if dot:
        return max(64, wide_load_k(block_n))
    return max(16, min(256, budget // (block_r * block_n)))


def expert_blocks(rows: int, k: int, intermediate: int, mxfp4: bool, dot: bool) -> dict:
    """BLOCK_I (intermediate rows per gate/up item), BLOCK_K (input elements per gate/up step), BLOCK_NO
    (output columns per down tile), BLOCK_KI (intermediate elements per down step). MXFP4 steps are >= 32
    elements (whole scale groups) and 256 on a GPU: 128 bytes of each of the tile's 32 rows (gate/up: 64)
    per step, one 16-byte load per thread of the 8 warps, the next step's in flight (``gemv.py``)."""
    br, _ = row_block(rows)
    if interpreting():
        b = INTERPRET_BLOCKS
        kmin = 32 if mxfp4 else 16
        return dict(
            BLOCK_I=max(16, min(b["i"], pow2(intermediate))),
            BLOCK_K=max(kmin, min(b["k"], pow2(k))),
            BLOCK_NO=max(16, min(b["n"], pow2(k))),
            BLOCK_KI=max(kmin, min(b["k"], pow2(intermediate))),
        )
    if mxfp4:
        return dict(BLOCK_I=32, BLOCK_K=256, BLOCK_NO=32, BLOCK_KI=256)
    if dot:
        return dict(BLOCK_I=64, BLOCK_K=64, BLOCK_NO=32, BLOCK_KI=64)
    return dict(BLOCK_I=32, BLOCK_K=max(16, 4096 // (br * 32)), BLOCK_NO=16, BLOCK_KI=max(16, 8192 // (br * 16)))


def expert_programs(work_items: int, device) -> int:
    """Phase-1 programs of moe_experts: 2 per SM (each routes once, then strides over the work items;
    the interpreter's stand-in has 2 SMs)."""
    return max(1, min(work_items, 2 * num_sms(device)))


def _check_packed(kind: str, **weights: torch.Tensor) -> None:
    """The front and tail kernels index weight [N, K] row n at n·K (no stride argument): refuse a view with
    padded rows or sliced columns (a tensor-parallel column shard) instead of reading the wrong rows."""
    for role, t in weights.items():
        if not t.is_contiguous():
            raise ValueError(f"{kind}: weight {role!r} must be contiguous, got a view with strides {tuple(t.stride())}")


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
    outputs = dict(moe_logits=logits, moe_in=moe_in, moe_out=moe_out, moe_shared_act=act)
    require_unit_columns("moe_front", x=x, router=router, latent_down=down, shared_gate_up=gate_up, **outputs)
    _check_packed("moe_front", router=router, latent_down=down, shared_gate_up=gate_up, norm=norm)
    BR, dot = row_block(R)
    BN = INTERPRET_BLOCKS["n"] if interpreting() else 32
    BNR = BN if interpreting() else BN // 2  # fp32 router rows: half as many per tile, same bytes
    if dot:
        BN = BNR = max(BN, 16)
    BK = k_block(BR, BN, D, dot, budget=4096)  # shared tiles hold two products (gate and up)
    grid = (triton.cdiv(E, BNR) + triton.cdiv(W, BN) + (triton.cdiv(S, BN) if shared else 0),)
    moe_front_kernel[grid](
        x,
        x.stride(0),
        R,
        D,
        norm,
        a["eps"],
        router,
        E,
        logits,
        logits.stride(0),
        down,
        W,
        moe_in,
        moe_in.stride(0),
        moe_out,
        moe_out.stride(0),
        gate_up,
        S,
        act,
        act.stride(0),
        a["beta"],
        a["linear_beta"],
        HAS_NORM="norm" in w,
        LATENT=latent,
        HAS_SHARED=shared,
        ACT=act_code(a.get("act")),
        BLOCK_R=BR,
        BLOCK_NR=BNR,
        BLOCK_N=BN,
        BLOCK_K=BK,
        USE_DOT=dot,
        UPCAST=upcast_dots(),
        NUM_STAGES=pipeline_stages(),
        num_warps=NUM_WARPS,
        **pdl_launch_args(env),
    )


def expert_scratch(slots: int, R: int, I: int, BR: int, dtype, device) -> tuple:
    """The expert launch's scratch between its two phases, rewritten by every launch: the gate/up
    activations act [slots, R, I] (``dtype``), the chosen expert ids [slots] (int32) and the routing
    weights p [slots, BR] (fp32), each flat."""
    act = workspace("moe_experts.act", slots * R * I, dtype, device)
    ids = workspace("moe_experts.ids", slots, torch.int32, device)
    p = workspace("moe_experts.p", slots * BR, torch.float32, device)
    return act, ids, p


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
    bias = w.get("bias")
    require_unit_columns(
        "moe_experts", moe_logits=logits, moe_in=x, out=out, w1=w1, w3=w3, w2=w2, s1=s1, s2=s2, bias=bias
    )
    BR, dot = row_block(R)
    blocks = expert_blocks(R, K, I, mxfp4, dot)
    route = routing_blocks(R, E, mc.num_groups, mc.top_k)
    route["BLOCK_R"] = BR
    n_chunks = triton.cdiv(I, blocks["BLOCK_I"])
    slots = min(E, R * mc.top_k)
    n_gate_up = expert_programs(slots * n_chunks, x.device)
    n_down = triton.cdiv(K, blocks["BLOCK_NO"])
    act, ids, p = expert_scratch(slots, R, I, BR, x.dtype, x.device)
    moe_experts_kernel[(n_gate_up + n_down,)](
        phase_counters("moe_experts", x.device),
        n_gate_up,
        n_down,
        logits,
        logits.stride(0),
        bias if bias is not None else logits,
        R,
        E,
        E // mc.num_groups,
        mc.top_k,
        mc.topk_groups,
        float(mc.routed_scaling_factor),
        x,
        x.stride(0),
        out,
        out.stride(0),
        K,
        I,
        n_chunks,
        slots,
        act,
        ids,
        p,
        w1,
        w3,
        w2,
        s1,
        s3,
        s2,
        w1.stride(0),
        w1.stride(1),
        w2.stride(0),
        w2.stride(1),
        s1.stride(0),
        s1.stride(1),
        s2.stride(0),
        s2.stride(1),
        w1.shape[2] if mxfp4 else 0,
        w2.shape[2] if mxfp4 else 0,
        a["beta"],
        a["linear_beta"],
        SOFTMAX=mc.scoring == "softmax",
        RENORM=mc.renormalize,
        HAS_BIAS=bias is not None,
        GROUPED=mc.num_groups > 1,
        MXFP4=mxfp4,
        ACT=act_code(a.get("act")),
        **route,
        **blocks,
        USE_DOT=dot,
        UPCAST=upcast_dots(),
        NUM_STAGES=pipeline_stages(),
        num_warps=EXPERT_WARPS,
        maxnreg=MAX_REGISTERS,
        **pdl_launch_args(env),
    )


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
    require_unit_columns("moe_tail", moe_out=u, out=tgt, moe_shared_act=act, latent_up=up, shared_down=down)
    _check_packed("moe_tail", latent_up=up, shared_down=down, latent_norm=norm)
    BR, dot = row_block(R)
    BN = INTERPRET_BLOCKS["n"] if interpreting() else pick_block_n(D, num_sms(u.device), (32, 16))
    BK = k_block(BR, BN, max(L, act.shape[1]), dot)
    grid = (triton.cdiv(D, BN),)
    moe_tail_kernel[grid](
        u,
        u.stride(0),
        R,
        L,
        norm,
        a["eps"],
        up,
        act,
        act.stride(0),
        act.shape[1] if shared else 0,
        down,
        tgt,
        tgt.stride(0),
        D,
        LATENT=latent,
        LATENT_NORM="latent_norm" in w,
        HAS_SHARED=shared,
        ACCUMULATE=a.get("accumulate", False),
        DT=_DTYPES[moe_in.dtype],
        BLOCK_R=BR,
        BLOCK_N=BN,
        BLOCK_K=BK,
        USE_DOT=dot,
        UPCAST=upcast_dots(),
        NUM_STAGES=pipeline_stages(),
        num_warps=NUM_WARPS,
        **pdl_launch_args(env),
    )


KERNELS = {"moe_front": launch_moe_front, "moe_experts": launch_moe_experts, "moe_tail": launch_moe_tail}
