"""MLA super-ops (DeepSeek-V3 / Kimi K2 RoPE + YaRN, Kimi Linear NoPE, Kimi K3 NoPE + output gate).

Twins: ``mla_in_proj``, ``mla_q_up``, ``mla_attn`` in ``nonstop/program/reference.py``. Shapes (per
row; N heads, P = qk_nope, Rr = qk_rope, V = v_head, L = kv_lora, Q = q_lora or absent):

mla_in_proj  x [d] -> [q_in | kv | g] = W_in RMSNorm(x),   W_in = [W_qa (Q) or W_q (N(P+Rr)) | W_kva (L+Rr) | W_g (NV)]
mla_q_up     q = W_qb RMSNorm(q_in) (q-LoRA) or q_in -> per head [q_nope (P) | q_pe (Rr)];
             c = RMSNorm(kv[:L]); k_pe = kv[L:]; RoPE (GPT-J or NeoX pairs) on q_pe and k_pe when the op
             has ``inv_freq``; cache[pos] = [c | k_pe]; q_lat[h] = W_UK[h]ᵀ q_nope[h] (fp32) [N, L]
mla_attn     s_h(j) = scale · (q_lat[h] · c_j + q_pe[h] · k_pe_j) for cached keys j <= the row's position;
             o_h = W_UV[h] Σ_j softmax(s_h)_j c_j; out = o ⊙ sigmoid(g) when gated        out [N·V]

Tile functions (the megakernel calls the same bodies; see each docstring for its tile index):
``mla_in_proj_tile``, ``mla_q_up_tile``, ``mla_attn_tile`` (two phases: ``mla_attn_split_tile``,
``mla_attn_combine_tile``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nonstop.kernels.attn_tiles import (
    choose_split,
    merge_splits,
    online_softmax_step,
    pool_rows,
    rope_pair_channels,
    rope_rotate,
    row_positions,
    store_partial,
)
from nonstop.kernels.gemv import gemv_rows, mm, rms_apply, row_inv_rms
from nonstop.kernels.launch import (
    launcher,
    pdl_launch_args,
    phase_counters,
    phase_done,
    phase_ticket,
    require_unit_columns,
    workspace,
)
from nonstop.kernels.platform import dot_mode, on_gpu, pow2, row_block, wide_load_k

# GPU block sizes, checked by compiling for sm_90 at K3 shapes (``nonstop gpucheck``):
ON_GPU_BLOCK_N = 32  # output rows per in-proj tile
ON_GPU_BLOCK_K = 256
Q_UP_BLOCK_K = 64  # q_up streams [128 + 2·32 head rows] x 64 columns per step (at least; see q_up_block_k)
ATTN_BLOCK_M = 32  # query (row, head) items per attention split tile
ATTN_BLOCK_S = 32  # keys per inner step
# caps on the q_up W_UK step (latent columns) and the combine W_UV step (output columns); tests lower them to 16
# so that the tiny models' latents and value heads take several steps, as K3's 512 and 128 do
Q_UP_BLOCK_LC = 64
COMBINE_BLOCK_V = 64
NUM_STAGES = 3

# ----------------------------------------------------------------------------- mla_in_proj


@triton.jit
def mla_in_proj_tile(
    tile,
    x_ptr,
    x_stride,
    norm_ptr,
    w_ptr,
    w_stride,
    q_ptr,
    q_stride,
    kv_ptr,
    kv_stride,
    g_ptr,
    g_stride,
    n_q,
    n_kv,
    n_g,
    R,
    K,
    eps,
    HAS_NORM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Output rows [tile·BLOCK_N, +BLOCK_N) of y = W_in RMSNorm(x), for all R rows; each output channel
    goes to its part: q_in (n < n_q), kv (next n_kv), gate logits (next n_g). Tiles: cdiv(n_q+n_kv+n_g, BLOCK_N)."""
    DT: tl.constexpr = w_ptr.dtype.element_ty
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_R)
    rmask = (rows < R)[:, None]
    if HAS_NORM:
        rstd = row_inv_rms(x_ptr, x_stride, R, K, eps, DT, BLOCK_R, BLOCK_K)
    else:
        rstd = tl.full([BLOCK_R], 1.0, tl.float32)
    y, _ = gemv_rows(
        x_ptr,
        x_stride,
        R,
        0,
        K,
        norm_ptr,
        rstd,
        w_ptr,
        w_ptr,
        w_stride,
        w_ptr,
        w_ptr,
        0,
        0,
        n,
        n,
        n < n_q + n_kv + n_g,
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
    y = y.to(DT)
    tl.store(q_ptr + rows[:, None] * q_stride + n[None, :], y, mask=rmask & (n < n_q)[None, :])
    nk = n - n_q
    tl.store(kv_ptr + rows[:, None] * kv_stride + nk[None, :], y, mask=rmask & ((nk >= 0) & (nk < n_kv))[None, :])
    ng = nk - n_kv
    tl.store(g_ptr + rows[:, None] * g_stride + ng[None, :], y, mask=rmask & ((ng >= 0) & (ng < n_g))[None, :])


mla_in_proj_kernel = launcher(mla_in_proj_tile, prefetch=("w_ptr", "pid * BLOCK_N * w_stride", "BLOCK_N * w_stride"))


def mla_in_proj(op, env) -> None:
    x = env.buf[op.reads[0]]
    w = op.weights["w_in"]
    outs = [env.buf[name] for name in op.writes]
    sizes = list(op.attrs["in_sizes"]) + [0] * (3 - len(op.writes))
    outs = outs + [outs[0]] * (3 - len(outs))  # no gate: a never-written stand-in
    norm = op.weights.get("norm")
    require_unit_columns("mla_in_proj", x=x, w_in=w, norm=norm, **dict(zip(op.writes, outs)))
    R, K = x.shape
    gpu = on_gpu(x.device)
    block_n = ON_GPU_BLOCK_N if gpu else pow2(min(sum(sizes), 32), 16)
    block_k = min(ON_GPU_BLOCK_K, pow2(K, 16)) if gpu else pow2(K, 16)
    block_r, use_dot = row_block(R)
    grid = (triton.cdiv(sum(sizes), block_n),)
    mla_in_proj_kernel[grid](
        x,
        x.stride(0),
        norm if norm is not None else w,
        w,
        w.stride(0),
        outs[0],
        outs[0].stride(0),
        outs[1],
        outs[1].stride(0),
        outs[2],
        outs[2].stride(0),
        sizes[0],
        sizes[1],
        sizes[2],
        R,
        K,
        op.attrs["eps"],
        HAS_NORM=norm is not None,
        BLOCK_R=block_r,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        NUM_STAGES=NUM_STAGES,
        USE_DOT=use_dot,
        UPCAST=dot_mode(w.dtype)["UPCAST"],
        num_warps=4,
        **pdl_launch_args(env),
    )


# ----------------------------------------------------------------------------- mla_q_up


@triton.jit
def mla_q_up_tile(
    tile,
    q_in_ptr,
    q_in_stride,
    kv_ptr,
    kv_stride,
    q_norm_ptr,
    q_b_ptr,
    q_b_stride,
    kv_norm_ptr,
    w_uk_ptr,
    uk_head_stride,
    uk_row_stride,
    inv_freq_ptr,
    magnitude,
    q_lat_ptr,
    q_lat_stride,
    q_pe_ptr,
    q_pe_stride,
    latent_ptr,
    latent_stride,
    slots_ptr,
    start_ptr,
    table_ptr,
    table_stride,
    PAGE_SIZE: tl.constexpr,
    R,
    T,
    N,
    P,
    RR,
    L,
    Q,
    eps,
    Q_LORA: tl.constexpr,
    HAS_ROPE: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_HR: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_KR: tl.constexpr,
    BLOCK_LC: tl.constexpr,
    BLOCK_L: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    TF32_ROUND: tl.constexpr,
):
    """Tile h < N: head h of all rows - q = W_qb[h] RMSNorm(c_q) (or q_in[h]), RoPE on q_pe, write q_pe[h] and
    q_lat[h] = W_UK[h]ᵀ q_nope (fp32, BLOCK_LC latent columns at a time). Tile N: the shared latent -
    c = RMSNorm(kv[:L]), RoPE on k_pe, append [c | k_pe] to the paged cache. Tiles: N + 1.
    BLOCK_R >= 16 (the W_UK product is a tensor-core dot). W_qb streams in steps of BLOCK_K columns for the
    [BLOCK_P, *] q_nope rows and BLOCK_KR for the [2·BLOCK_HR, *] RoPE rows (``q_up_block_k``)."""
    DT: tl.constexpr = latent_ptr.dtype.element_ty
    rows = tl.arange(0, BLOCK_R)
    rmask = rows < R
    pos = row_positions(start_ptr, rows, T, rmask)
    HALF = RR // 2
    i = tl.arange(0, BLOCK_HR)
    imask = i < HALF
    first, second = rope_pair_channels(i, HALF, INTERLEAVED)
    pe_mask = rmask[:, None] & imask[None, :]
    if tile < N:
        h = tile
        base = h * (P + RR)
        p = tl.arange(0, BLOCK_P)
        pmask = p < P
        if Q_LORA:
            rstd = row_inv_rms(q_in_ptr, q_in_stride, R, Q, eps, DT, BLOCK_R, BLOCK_K)
            q_nope, _ = gemv_rows(
                q_in_ptr,
                q_in_stride,
                R,
                0,
                Q,
                q_norm_ptr,
                rstd,
                q_b_ptr,
                q_b_ptr,
                q_b_stride,
                q_b_ptr,
                q_b_ptr,
                0,
                0,
                base + p,
                base + p,
                pmask,
                True,
                False,
                False,
                DT,
                BLOCK_R,
                BLOCK_K,
                True,
                UPCAST,
                NUM_STAGES,
            )
            # both channels of every pair as ONE tile of 2·BLOCK_HR weight rows [first | second]: one dot of
            # N = 2·BLOCK_HR >= 32 (two of N = 16 cost Triton 3.6 ~250 registers in the megakernel)
            j = tl.arange(0, 2 * BLOCK_HR)
            ja, jb = rope_pair_channels(j % BLOCK_HR, HALF, INTERLEAVED)
            pe, _ = gemv_rows(
                q_in_ptr,
                q_in_stride,
                R,
                0,
                Q,
                q_norm_ptr,
                rstd,
                q_b_ptr,
                q_b_ptr,
                q_b_stride,
                q_b_ptr,
                q_b_ptr,
                0,
                0,
                base + P + tl.where(j < BLOCK_HR, ja, jb),
                base + P + tl.where(j < BLOCK_HR, ja, jb),
                j % BLOCK_HR < HALF,
                True,
                False,
                False,
                DT,
                BLOCK_R,
                BLOCK_KR,
                True,
                UPCAST,
                NUM_STAGES,
            )
            pe_a, pe_b = tl.split(tl.permute(tl.reshape(pe.to(DT), [BLOCK_R, 2, BLOCK_HR]), (0, 2, 1)))
            q_nope = q_nope.to(DT)
        else:
            row_base = q_in_ptr + rows[:, None] * q_in_stride + base
            q_nope = tl.load(row_base + p[None, :], mask=rmask[:, None] & pmask[None, :], other=0.0).to(DT)
            pe_a = tl.load(row_base + P + first[None, :], mask=pe_mask, other=0.0).to(DT)
            pe_b = tl.load(row_base + P + second[None, :], mask=pe_mask, other=0.0).to(DT)
        if HAS_ROPE:
            ra, rb = rope_rotate(pe_a.to(tl.float32), pe_b.to(tl.float32), pos, inv_freq_ptr, i, imask, magnitude)
            pe_a = ra.to(DT)
            pe_b = rb.to(DT)
        pe_out = q_pe_ptr + rows[:, None] * q_pe_stride + h * RR
        tl.store(pe_out + first[None, :], pe_a, mask=pe_mask)
        tl.store(pe_out + second[None, :], pe_b, mask=pe_mask)
        for l0 in range(0, L, BLOCK_LC):
            lc = l0 + tl.arange(0, BLOCK_LC)
            lmask = lc < L
            w_uk = tl.load(
                w_uk_ptr + h * uk_head_stride + p[:, None] * uk_row_stride + lc[None, :],
                mask=pmask[:, None] & lmask[None, :],
                other=0.0,
            )
            q_lat = mm(q_nope, w_uk, UPCAST, PREC, TF32_ROUND)
            tl.store(
                q_lat_ptr + rows[:, None] * q_lat_stride + h * L + lc[None, :],
                q_lat,
                mask=rmask[:, None] & lmask[None, :],
            )
    else:
        lat = tl.arange(0, BLOCK_L)
        lmask = lat < L
        mask = rmask[:, None] & lmask[None, :]
        c = tl.load(kv_ptr + rows[:, None] * kv_stride + lat[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(c * c, axis=1) / L + eps)
        c = rms_apply(c, rstd, tl.load(kv_norm_ptr + lat, mask=lmask, other=0.0), DT)
        k_a = tl.load(kv_ptr + rows[:, None] * kv_stride + L + first[None, :], mask=pe_mask, other=0.0)
        k_b = tl.load(kv_ptr + rows[:, None] * kv_stride + L + second[None, :], mask=pe_mask, other=0.0)
        if HAS_ROPE:
            ra, rb = rope_rotate(k_a.to(tl.float32), k_b.to(tl.float32), pos, inv_freq_ptr, i, imask, magnitude)
            k_a = ra.to(DT)
            k_b = rb.to(DT)
        slot = tl.load(slots_ptr + rows // T, mask=rmask, other=0)
        dest = latent_ptr + pool_rows(table_ptr, table_stride, slot, pos, PAGE_SIZE, rmask)[:, None] * latent_stride
        tl.store(dest + lat[None, :], c, mask=mask)
        tl.store(dest + L + first[None, :], k_a.to(DT), mask=pe_mask)
        tl.store(dest + L + second[None, :], k_b.to(DT), mask=pe_mask)


mla_q_up_kernel = launcher(mla_q_up_tile)


def q_up_block_k(block_n: int, Q: int, gpu: bool) -> int:
    """K step of a [block_n, Q] slice of W_qb: ``Q_UP_BLOCK_K`` columns, or more where that would leave the
    threads of 8 warps (the launch's and the megakernel's) under one 16-byte load each (``platform.wide_load_k``:
    16 rows need 128); the whole (padded) row in the interpreter or when it is narrower."""
    whole = pow2(Q, 16)
    return min(max(Q_UP_BLOCK_K, wide_load_k(block_n)), whole) if gpu else whole


def mla_q_up(op, env) -> None:
    a = op.attrs
    N, P, RR, L = a["heads"], a["nope"], a["rope"], a["kv_lora"]
    q_in, kv = env.buf[op.reads[0]], env.buf[op.reads[1]]
    q_lat, q_pe = env.buf[op.writes[0]], env.buf[op.writes[1]]
    layer = env.cache.layers[a["cache_layer"]]
    layer.fit_pool()
    latent = layer.tensors["latent"]
    pages = layer.pages
    w_uk = op.weights["w_uk"]  # [N, P, L] view of kv_b_proj
    q_lora = "q_b" in op.weights
    q_b = op.weights.get("q_b", w_uk)
    require_unit_columns("mla_q_up", q_in=q_in, kv=kv, q_lat=q_lat, q_pe=q_pe, w_uk=w_uk, q_b=q_b)
    inv_freq = op.weights.get("inv_freq")
    R = q_in.shape[0]
    Q = q_in.shape[1] if q_lora else 0
    gpu = on_gpu(q_in.device)
    mla_q_up_kernel[(N + 1,)](
        q_in,
        q_in.stride(0),
        kv,
        kv.stride(0),
        op.weights.get("q_norm", kv),
        q_b,
        q_b.stride(0),
        op.weights["kv_norm"],
        w_uk,
        w_uk.stride(0),
        w_uk.stride(1),
        inv_freq if inv_freq is not None else kv,
        float(a["rope_magnitude"]),
        q_lat,
        q_lat.stride(0),
        q_pe,
        q_pe.stride(0),
        latent,
        latent.stride(0),
        env.batch.slots,
        env.batch.start,
        pages.table,
        pages.table.stride(0),
        pages.page_size,
        R,
        env.T,
        N,
        P,
        RR,
        L,
        Q,
        a["lora_eps"],
        Q_LORA=q_lora,
        HAS_ROPE=inv_freq is not None,
        INTERLEAVED=bool(a["interleaved"]),
        BLOCK_R=pow2(R, 16),
        BLOCK_P=pow2(P, 16),
        BLOCK_HR=pow2(RR // 2, 16),
        BLOCK_K=q_up_block_k(pow2(P, 16), Q, gpu),
        BLOCK_KR=q_up_block_k(2 * pow2(RR // 2, 16), Q, gpu),
        BLOCK_LC=min(Q_UP_BLOCK_LC, pow2(L, 16)),
        BLOCK_L=pow2(L, 16),
        NUM_STAGES=NUM_STAGES,
        **dot_mode(latent.dtype),
        num_warps=8,
        **pdl_launch_args(env),
    )


# ----------------------------------------------------------------------------- mla_attn


@triton.jit
def mla_attn_split_tile(
    tile,
    q_lat_ptr,
    q_pe_ptr,
    latent_ptr,
    latent_stride,
    slots_ptr,
    start_ptr,
    table_ptr,
    table_stride,
    PAGE_SIZE: tl.constexpr,
    ml_ptr,
    acc_ptr,
    T,
    N,
    RR,
    L,
    scale,
    SPLIT,
    NS,
    MB,
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_RR: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    TF32_ROUND: tl.constexpr,
):
    """Tile (b, split, mb) = (tile // (NS·MB), tile // MB % NS, tile % MB): query items m = t·N + h in block mb
    of sequence b (T·N items, MB = cdiv(T·N, BLOCK_M) blocks) over keys [split·SPLIT, +SPLIT) ∩ [0, end_b).
    Each key tile (BLOCK_S latents of dim L + Rr, gathered through the page table) is loaded once for all
    BLOCK_M items; the MB blocks of one split are consecutive tiles, so they share those loads in L2.
    Writes the partial (max, denominator, Σ p·c) of every item; a split past end_b does nothing.
    Tiles: B·NS·MB."""
    DT: tl.constexpr = latent_ptr.dtype.element_ty
    b = tile // (NS * MB)
    split = tile // MB % NS
    mb = tile % MB
    slot = tl.load(slots_ptr + b)
    start = tl.load(start_ptr + b).to(tl.int32)
    end = start + T
    s_begin = split * SPLIT
    if s_begin < end:
        m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        mmask = m < T * N
        items = b * T * N + m  # = row·N + head: the [R, N, ...] index of this (row, head)
        pos = start + m // N
        lat = tl.arange(0, BLOCK_L)
        lmask = lat < L
        e = tl.arange(0, BLOCK_RR)
        emask = e < RR
        q = tl.load(
            q_lat_ptr + items[:, None].to(tl.int64) * L + lat[None, :], mask=mmask[:, None] & lmask[None, :], other=0.0
        ).to(DT)
        q_pe = tl.load(
            q_pe_ptr + items[:, None].to(tl.int64) * RR + e[None, :], mask=mmask[:, None] & emask[None, :], other=0.0
        ).to(DT)
        mx = tl.zeros([BLOCK_M], dtype=tl.float32) - 1.0e30
        den = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_L], dtype=tl.float32)
        s_end = tl.minimum(s_begin + SPLIT, end)
        for s0 in tl.range(s_begin, s_end, BLOCK_S, num_stages=NUM_STAGES):
            s = s0 + tl.arange(0, BLOCK_S)
            smask = s < s_end
            row = latent_ptr + pool_rows(table_ptr, table_stride, slot, s, PAGE_SIZE, smask)[:, None] * latent_stride
            c = tl.load(row + lat[None, :], mask=smask[:, None] & lmask[None, :], other=0.0)
            k_pe = tl.load(row + L + e[None, :], mask=smask[:, None] & emask[None, :], other=0.0)
            scores = (
                mm(q, tl.trans(c), UPCAST, PREC, TF32_ROUND) + mm(q_pe, tl.trans(k_pe), UPCAST, PREC, TF32_ROUND)
            ) * scale
            visible = (s[None, :] <= pos[:, None]) & smask[None, :]
            p, mx, den, acc = online_softmax_step(scores, visible, mx, den, acc)
            acc += mm(p.to(DT), c, UPCAST, PREC, TF32_ROUND)
        store_partial(ml_ptr, acc_ptr, items, mmask, split, NS, L, mx, den, acc, BLOCK_L)


@triton.jit
def mla_attn_combine_tile(
    h,
    ml_ptr,
    acc_ptr,
    start_ptr,
    w_uv_ptr,
    uv_head_stride,
    uv_row_stride,
    gate_ptr,
    gate_stride,
    out_ptr,
    out_stride,
    R,
    T,
    N,
    L,
    V,
    SPLIT,
    NS,
    GATED: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_V: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    TF32_ROUND: tl.constexpr,
):
    """Tile h (head): for every row, merge the splits covering keys 0..its position into the attended latent
    ō_h [L], then out[r, hV:(h+1)V] = (W_UV[h] ō_h) ⊙ sigmoid(g) - W_UV[h] is read once for all rows.
    Needs every split tile of the step done. Tiles: N."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    rows = tl.arange(0, BLOCK_R)
    rmask = rows < R
    pos = row_positions(start_ptr, rows, T, rmask)
    n_valid = tl.where(rmask, pos // SPLIT + 1, 0)
    o_lat = merge_splits(ml_ptr, acc_ptr, rows * N + h, n_valid, NS, L, BLOCK_L)
    lat = tl.arange(0, BLOCK_L)
    for v0 in range(0, V, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        vmask = v < V
        w_uv = tl.load(
            w_uv_ptr + h * uv_head_stride + v[:, None] * uv_row_stride + lat[None, :],
            mask=vmask[:, None] & (lat < L)[None, :],
            other=0.0,
        )
        o = mm(o_lat, tl.trans(w_uv.to(tl.float32)), UPCAST, PREC, TF32_ROUND)
        omask = rmask[:, None] & vmask[None, :]
        if GATED:
            g = tl.load(gate_ptr + rows[:, None] * gate_stride + h * V + v[None, :], mask=omask, other=0.0).to(
                tl.float32
            )
            o = o * tl.sigmoid(g)
        tl.store(out_ptr + rows[:, None] * out_stride + h * V + v[None, :], o.to(DT), mask=omask)


@triton.jit
def mla_attn_tile(
    tile,
    counters_ptr,
    n_split_tiles,
    n_combine_tiles,
    q_lat_ptr,
    q_pe_ptr,
    latent_ptr,
    latent_stride,
    slots_ptr,
    start_ptr,
    table_ptr,
    table_stride,
    PAGE_SIZE: tl.constexpr,
    ml_ptr,
    acc_ptr,
    w_uv_ptr,
    uv_head_stride,
    uv_row_stride,
    gate_ptr,
    gate_stride,
    out_ptr,
    out_stride,
    R,
    T,
    N,
    RR,
    L,
    V,
    scale,
    SPLIT,
    NS,
    MB,
    GATED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_RR: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    TF32_ROUND: tl.constexpr,
    PHASE: tl.constexpr,
):
    """Absorbed latent attention in two phases (``launch.py``): 1 ``split`` tiles (``mla_attn_split_tile``),
    2 ``combine`` tiles (``mla_attn_combine_tile``); 0 the in-launch protocol (counters int32 [3])."""
    phase = PHASE
    if PHASE == 0:
        phase, tile = phase_ticket(counters_ptr, n_split_tiles)
    if phase == 1:
        mla_attn_split_tile(
            tile,
            q_lat_ptr,
            q_pe_ptr,
            latent_ptr,
            latent_stride,
            slots_ptr,
            start_ptr,
            table_ptr,
            table_stride,
            PAGE_SIZE,
            ml_ptr,
            acc_ptr,
            T,
            N,
            RR,
            L,
            scale,
            SPLIT,
            NS,
            MB,
            BLOCK_M,
            BLOCK_S,
            BLOCK_L,
            BLOCK_RR,
            NUM_STAGES,
            UPCAST,
            PREC,
            TF32_ROUND,
        )
    else:
        mla_attn_combine_tile(
            tile,
            ml_ptr,
            acc_ptr,
            start_ptr,
            w_uv_ptr,
            uv_head_stride,
            uv_row_stride,
            gate_ptr,
            gate_stride,
            out_ptr,
            out_stride,
            R,
            T,
            N,
            L,
            V,
            SPLIT,
            NS,
            GATED,
            BLOCK_R,
            BLOCK_L,
            BLOCK_V,
            UPCAST,
            PREC,
            TF32_ROUND,
        )
    if PHASE == 0:
        phase_done(counters_ptr, phase, n_combine_tiles)


mla_attn_kernel = launcher(mla_attn_tile, phases=("split", "combine"), first="n_split_tiles")


def mla_attn(op, env, split_tokens: int | None = None) -> None:
    """Launch mla_attn once; ``split_tokens`` fixes the KV split length (default: sized to fill the GPU)."""
    a = op.attrs
    N, RR, L, V = a["heads"], a["rope"], a["kv_lora"], a["v_dim"]
    q_lat, q_pe = env.buf[op.reads[0]], env.buf[op.reads[1]]
    out = env.buf[op.writes[0]]
    gate = env.buf[op.reads[2]] if a["gated"] else out
    layer = env.cache.layers[a["cache_layer"]]
    latent = layer.tensors["latent"]
    pages = layer.pages
    w_uv = op.weights["w_uv"]  # [N, V, L] view of kv_b_proj
    require_unit_columns("mla_attn", q_lat=q_lat, q_pe=q_pe, out=out, gate=gate, w_uv=w_uv)
    R, T, B = q_lat.shape[0], env.T, env.B
    block_m = min(ATTN_BLOCK_M, pow2(T * N, 16))
    block_s = ATTN_BLOCK_S if on_gpu(q_lat.device) else 16
    mb = triton.cdiv(T * N, block_m)
    context_bound = pages.table.shape[1] * pages.page_size  # >= every row's end; no device sync
    # ~one split tile per SM for one sequence (a tile needs ~all registers of an SM), splits of >= 128 keys.
    # The split length depends on neither B nor T, so a row's result does not depend on the step's other
    # rows (row-exact: speculative verification reproduces one-token decoding).
    split, ns = choose_split(
        context_bound,
        triton.cdiv(N, min(ATTN_BLOCK_M, pow2(N, 16))),
        block_s,
        q_lat.device,
        split_tokens,
        min_split=128,
        programs_per_sm=1,
    )
    ml = workspace("mla_attn.ml", R * N * ns * 2, torch.float32, q_lat.device)
    acc = workspace("mla_attn.acc", R * N * ns * L, torch.float32, q_lat.device)
    n_split_tiles = B * mb * ns
    mla_attn_kernel[(n_split_tiles + N,)](
        phase_counters("mla_attn", q_lat.device),
        n_split_tiles,
        N,
        q_lat,
        q_pe,
        latent,
        latent.stride(0),
        env.batch.slots,
        env.batch.start,
        pages.table,
        pages.table.stride(0),
        pages.page_size,
        ml,
        acc,
        w_uv,
        w_uv.stride(0),
        w_uv.stride(1),
        gate,
        gate.stride(0),
        out,
        out.stride(0),
        R,
        T,
        N,
        RR,
        L,
        V,
        float(a["scale"]),
        split,
        ns,
        mb,
        GATED=bool(a["gated"]),
        BLOCK_M=block_m,
        BLOCK_S=block_s,
        BLOCK_L=pow2(L, 16),
        BLOCK_RR=pow2(RR, 16),
        BLOCK_R=pow2(R, 16),
        BLOCK_V=min(COMBINE_BLOCK_V, pow2(V, 16)),
        NUM_STAGES=2,
        **dot_mode(latent.dtype),
        num_warps=8,
        **pdl_launch_args(env),
    )


KERNELS = {"mla_in_proj": mla_in_proj, "mla_q_up": mla_q_up, "mla_attn": mla_attn}
