"""GQA super-ops (Llama: packed q|k|v with optional bias, NeoX or GPT-J RoPE incl. llama3 scaling).

Twins: ``gqa_qkv_rope`` and ``gqa_attn`` in ``nonstop/program/reference.py``. Per row, H query heads
and Hkv key/value heads of dim D, G = H / Hkv query heads per group:

gqa_qkv_rope  [q | k | v] = W_qkv RMSNorm(x) (+ b); RoPE on q and k (pairs (i, i + D/2) or (2i, 2i+1));
              k, v appended to the paged cache at the row's position; writes q [H·D]
gqa_attn      o_h = Σ_j softmax_j(D^-½ q_h · k_j) v_j over keys j <= the row's position, k/v of the
              head's group                                                              o [H·D]

Tile functions: ``gqa_qkv_rope_tile``, ``gqa_attn_tile`` (two phases: ``gqa_attn_split_tile``,
``gqa_attn_combine_tile``).
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
from nonstop.kernels.gemv import gemv_rows, mm, row_inv_rms
from nonstop.kernels.launch import (
    launcher,
    pdl_launch_args,
    phase_counters,
    phase_done,
    phase_ticket,
    require_unit_columns,
    workspace,
)
from nonstop.kernels.platform import dot_mode, on_gpu, pow2, row_block

# GPU block sizes, checked by compiling for sm_90 at Llama-3-8B shapes (D = 128):
ON_GPU_BLOCK_K = 256
PAIRS_PER_TILE = 16  # RoPE pairs per qkv tile: 2·16 output channels of one head (163 registers at 4 warps)
ATTN_BLOCK_M = 64  # max query (row, head) items of one KV group per split tile
ATTN_BLOCK_S = 64  # keys per inner step at D <= 128 (190 registers, no spills at 8 warps and BLOCK_M 16)
NUM_STAGES = 3

# ----------------------------------------------------------------------------- gqa_qkv_rope


@triton.jit
def gqa_qkv_rope_tile(
    tile,
    x_ptr,
    x_stride,
    norm_ptr,
    w_ptr,
    w_stride,
    bias_ptr,
    inv_freq_ptr,
    magnitude,
    q_ptr,
    q_stride,
    k_ptr,
    v_ptr,
    kv_stride,
    slots_ptr,
    start_ptr,
    table_ptr,
    table_stride,
    PAGE_SIZE: tl.constexpr,
    R,
    T,
    K,
    H,
    HKV,
    D,
    eps,
    HAS_NORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Tile (j, pb) = (tile // PB, tile % PB), PB = cdiv(D/2, BLOCK_P): RoPE pairs [pb·BLOCK_P, +BLOCK_P) of
    packed head j (q heads 0..H-1, then k heads, then v heads), for all R rows. Both channels of each pair
    are projected here, so the rotation needs nothing from other tiles (v heads are not rotated). q goes to
    the q buffer, k and v to the cache rows of the rows' positions. Tiles: (H + 2·Hkv)·PB."""
    DT: tl.constexpr = w_ptr.dtype.element_ty
    HALF = D // 2
    n_pb = tl.cdiv(HALF, BLOCK_P)
    j = tile // n_pb
    i = tile % n_pb * BLOCK_P + tl.arange(0, BLOCK_P)
    imask = i < HALF
    first, second = rope_pair_channels(i, HALF, INTERLEAVED)
    rows = tl.arange(0, BLOCK_R)
    rmask = rows < R
    if HAS_NORM:
        rstd = row_inv_rms(x_ptr, x_stride, R, K, eps, DT, BLOCK_R, BLOCK_K)
    else:
        rstd = tl.full([BLOCK_R], 1.0, tl.float32)
    base = j * D
    a, b = gemv_rows(
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
        base + first,
        base + second,
        imask,
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
    if HAS_BIAS:
        a += tl.load(bias_ptr + base + first, mask=imask, other=0.0).to(tl.float32)[None, :]
        b += tl.load(bias_ptr + base + second, mask=imask, other=0.0).to(tl.float32)[None, :]
    a = a.to(DT)
    b = b.to(DT)
    pos = row_positions(start_ptr, rows, T, rmask)
    if j < H + HKV:
        ra, rb = rope_rotate(a.to(tl.float32), b.to(tl.float32), pos, inv_freq_ptr, i, imask, magnitude)
        a = ra.to(DT)
        b = rb.to(DT)
    mask = rmask[:, None] & imask[None, :]
    if j < H:
        out = q_ptr + rows[:, None] * q_stride + base
        tl.store(out + first[None, :], a, mask=mask)
        tl.store(out + second[None, :], b, mask=mask)
    else:
        slot = tl.load(slots_ptr + rows // T, mask=rmask, other=0)
        prow = pool_rows(table_ptr, table_stride, slot, pos, PAGE_SIZE, rmask)
        g = (j - H) % HKV
        dest = prow[:, None] * kv_stride + g * D
        if j < H + HKV:
            tl.store(k_ptr + dest + first[None, :], a, mask=mask)
            tl.store(k_ptr + dest + second[None, :], b, mask=mask)
        else:
            tl.store(v_ptr + dest + first[None, :], a, mask=mask)
            tl.store(v_ptr + dest + second[None, :], b, mask=mask)


gqa_qkv_rope_kernel = launcher(gqa_qkv_rope_tile)


def gqa_qkv_rope(op, env) -> None:
    a = op.attrs
    H, HKV, D = a["heads"], a["kv_heads"], a["head_dim"]
    x, q = env.buf[op.reads[0]], env.buf[op.writes[0]]
    w = op.weights["w_qkv"]
    norm, bias = op.weights.get("norm"), op.weights.get("b_qkv")
    layer = env.cache.layers[a["cache_layer"]]
    layer.fit_pool()
    k_pool, v_pool = layer.tensors["k"], layer.tensors["v"]
    pages = layer.pages
    require_unit_columns("gqa_qkv_rope", x=x, w_qkv=w, norm=norm, b_qkv=bias, q=q)
    R, K = x.shape
    block_p = min(PAIRS_PER_TILE, pow2(D // 2, 16))
    block_k = min(ON_GPU_BLOCK_K, pow2(K, 16)) if on_gpu(x.device) else pow2(K, 16)
    block_r, use_dot = row_block(R)
    grid = ((H + 2 * HKV) * triton.cdiv(D // 2, block_p),)
    gqa_qkv_rope_kernel[grid](
        x,
        x.stride(0),
        norm if norm is not None else w,
        w,
        w.stride(0),
        bias if bias is not None else w,
        op.weights["inv_freq"],
        float(a["rope_magnitude"]),
        q,
        q.stride(0),
        k_pool,
        v_pool,
        k_pool.stride(0),
        env.batch.slots,
        env.batch.start,
        pages.table,
        pages.table.stride(0),
        pages.page_size,
        R,
        env.T,
        K,
        H,
        HKV,
        D,
        a["eps"],
        HAS_NORM=norm is not None,
        HAS_BIAS=bias is not None,
        INTERLEAVED=bool(a["interleaved"]),
        BLOCK_R=block_r,
        BLOCK_P=block_p,
        BLOCK_K=block_k,
        NUM_STAGES=NUM_STAGES,
        USE_DOT=use_dot,
        UPCAST=dot_mode(w.dtype)["UPCAST"],
        num_warps=4,
        **pdl_launch_args(env),
    )


# ----------------------------------------------------------------------------- gqa_attn


@triton.jit
def gqa_attn_split_tile(
    tile,
    q_ptr,
    k_ptr,
    v_ptr,
    kv_stride,
    slots_ptr,
    start_ptr,
    table_ptr,
    table_stride,
    PAGE_SIZE: tl.constexpr,
    ml_ptr,
    acc_ptr,
    out_ptr,
    T,
    H,
    HKV,
    D,
    scale,
    SPLIT,
    NS,
    MB,
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    TF32_ROUND: tl.constexpr,
):
    """Tile (b, g, mb, split) = (tile // (HKV·MB·NS), tile // (MB·NS) % HKV, tile // NS % MB, tile % NS): the
    query items m = t·G + i (head g·G + i of row b·T + t) of block mb, over keys [split·SPLIT, +SPLIT) ∩
    [0, end_b); each K/V tile of group g is loaded once for all of them. A sequence whose keys fit one split
    writes its output o [R, H·D] directly; otherwise the tile writes its partial. Splits past end_b do
    nothing. Tiles: B·Hkv·MB·NS."""
    DT: tl.constexpr = k_ptr.dtype.element_ty
    G = H // HKV
    b = tile // (HKV * MB * NS)
    g = tile // (MB * NS) % HKV
    mb = tile // NS % MB
    split = tile % NS
    slot = tl.load(slots_ptr + b)
    start = tl.load(start_ptr + b).to(tl.int32)
    end = start + T
    s_begin = split * SPLIT
    if s_begin < end:
        m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        mmask = m < T * G
        row = b * T + m // G
        head = g * G + m % G
        items = row * H + head
        pos = start + m // G
        d = tl.arange(0, BLOCK_D)
        dmask = d < D
        q = tl.load(
            q_ptr + items[:, None].to(tl.int64) * D + d[None, :], mask=mmask[:, None] & dmask[None, :], other=0.0
        )
        mx = tl.zeros([BLOCK_M], dtype=tl.float32) - 1.0e30
        den = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        s_end = tl.minimum(s_begin + SPLIT, end)
        for s0 in tl.range(s_begin, s_end, BLOCK_S, num_stages=NUM_STAGES):
            s = s0 + tl.arange(0, BLOCK_S)
            smask = s < s_end
            kv_off = (
                pool_rows(table_ptr, table_stride, slot, s, PAGE_SIZE, smask)[:, None] * kv_stride + g * D + d[None, :]
            )
            kv_mask = smask[:, None] & dmask[None, :]
            k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)
            v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
            scores = mm(q, tl.trans(k), UPCAST, PREC, TF32_ROUND) * scale
            visible = (s[None, :] <= pos[:, None]) & smask[None, :]
            p, mx, den, acc = online_softmax_step(scores, visible, mx, den, acc)
            acc += mm(p.to(DT), v, UPCAST, PREC, TF32_ROUND)
        if end <= SPLIT:
            o = acc / tl.where(den > 0, den, 1.0)[:, None]
            tl.store(
                out_ptr + items[:, None].to(tl.int64) * D + d[None, :], o.to(DT), mask=mmask[:, None] & dmask[None, :]
            )
        else:
            store_partial(ml_ptr, acc_ptr, items, mmask, split, NS, D, mx, den, acc, BLOCK_D)


@triton.jit
def gqa_attn_combine_tile(
    tile, ml_ptr, acc_ptr, start_ptr, out_ptr, T, H, HKV, D, SPLIT, NS, MB, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr
):
    """Tile (b, g, mb) = (tile // (HKV·MB), tile // MB % HKV, tile % MB): merge the splits of the block's
    query items (each over the splits holding keys 0..its position) into o [R, H·D]. Needs every split
    tile of (b, g, mb) done. A sequence whose keys fit one split was written by its split-0 tile: nothing
    to merge."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    G = H // HKV
    b = tile // (HKV * MB)
    g = tile // MB % HKV
    mb = tile % MB
    start = tl.load(start_ptr + b).to(tl.int32)
    if start + T > SPLIT:
        m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        mmask = m < T * G
        items = (b * T + m // G) * H + g * G + m % G
        pos = start + m // G
        o = merge_splits(ml_ptr, acc_ptr, items, tl.where(mmask, pos // SPLIT + 1, 0), NS, D, BLOCK_D)
        d = tl.arange(0, BLOCK_D)
        tl.store(
            out_ptr + items[:, None].to(tl.int64) * D + d[None, :], o.to(DT), mask=mmask[:, None] & (d < D)[None, :]
        )


@triton.jit
def gqa_attn_tile(
    tile,
    counters_ptr,
    n_split_tiles,
    n_combine_tiles,
    q_ptr,
    k_ptr,
    v_ptr,
    kv_stride,
    slots_ptr,
    start_ptr,
    table_ptr,
    table_stride,
    PAGE_SIZE: tl.constexpr,
    ml_ptr,
    acc_ptr,
    out_ptr,
    T,
    H,
    HKV,
    D,
    scale,
    SPLIT,
    NS,
    MB,
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    TF32_ROUND: tl.constexpr,
    PHASE: tl.constexpr,
):
    """Split-KV attention in two phases (``launch.py``): 1 ``split`` tiles (``gqa_attn_split_tile``),
    2 ``combine`` tiles (``gqa_attn_combine_tile``); 0 the in-launch protocol (counters int32 [3])."""
    phase = PHASE
    if PHASE == 0:
        phase, tile = phase_ticket(counters_ptr, n_split_tiles)
    if phase == 1:
        gqa_attn_split_tile(
            tile,
            q_ptr,
            k_ptr,
            v_ptr,
            kv_stride,
            slots_ptr,
            start_ptr,
            table_ptr,
            table_stride,
            PAGE_SIZE,
            ml_ptr,
            acc_ptr,
            out_ptr,
            T,
            H,
            HKV,
            D,
            scale,
            SPLIT,
            NS,
            MB,
            BLOCK_M,
            BLOCK_S,
            BLOCK_D,
            NUM_STAGES,
            UPCAST,
            PREC,
            TF32_ROUND,
        )
    else:
        gqa_attn_combine_tile(tile, ml_ptr, acc_ptr, start_ptr, out_ptr, T, H, HKV, D, SPLIT, NS, MB, BLOCK_M, BLOCK_D)
    if PHASE == 0:
        phase_done(counters_ptr, phase, n_combine_tiles)


gqa_attn_kernel = launcher(gqa_attn_tile, phases=("split", "combine"), first="n_split_tiles")


def attn_block_s(block_d: int) -> int:
    """Keys per inner step of a split tile: ``ATTN_BLOCK_S`` at head dims up to 128, fewer for wider heads so
    the [keys, head dim] K and V tiles keep their size (a 176-dim head padded to 256 at 64 keys spilled)."""
    return max(16, ATTN_BLOCK_S * 128 // max(128, block_d))


def gqa_attn(op, env, split_tokens: int | None = None) -> None:
    """Launch gqa_attn once; ``split_tokens`` fixes the KV split length (default: sized to fill the GPU)."""
    a = op.attrs
    H, HKV, D = a["heads"], a["kv_heads"], a["head_dim"]
    q, out = env.buf[op.reads[0]], env.buf[op.writes[0]]
    layer = env.cache.layers[a["cache_layer"]]
    k_pool, v_pool = layer.tensors["k"], layer.tensors["v"]
    pages = layer.pages
    R, T, B = q.shape[0], env.T, env.B
    G = H // HKV
    block_m = min(ATTN_BLOCK_M, pow2(T * G, 16))
    block_s = attn_block_s(pow2(D, 16)) if on_gpu(q.device) else 16
    mb = triton.cdiv(T * G, block_m)
    context_bound = pages.table.shape[1] * pages.page_size  # >= every row's end; no device sync
    # the split length depends on neither B nor T (row-exact: see mla_attn)
    split, ns = choose_split(
        context_bound,
        HKV * triton.cdiv(G, min(ATTN_BLOCK_M, pow2(G, 16))),
        block_s,
        q.device,
        split_tokens,
        min_split=128,
    )
    ml = workspace("gqa_attn.ml", R * H * ns * 2, torch.float32, q.device)
    acc = workspace("gqa_attn.acc", R * H * ns * D, torch.float32, q.device)
    n_split_tiles, n_combine_tiles = B * HKV * mb * ns, B * HKV * mb
    gqa_attn_kernel[(n_split_tiles + n_combine_tiles,)](
        phase_counters("gqa_attn", q.device),
        n_split_tiles,
        n_combine_tiles,
        q,
        k_pool,
        v_pool,
        k_pool.stride(0),
        env.batch.slots,
        env.batch.start,
        pages.table,
        pages.table.stride(0),
        pages.page_size,
        ml,
        acc,
        out,
        T,
        H,
        HKV,
        D,
        D**-0.5,
        split,
        ns,
        mb,
        BLOCK_M=block_m,
        BLOCK_S=block_s,
        BLOCK_D=pow2(D, 16),
        NUM_STAGES=2,
        **dot_mode(k_pool.dtype),
        num_warps=8,
        **pdl_launch_args(env),
    )


KERNELS = {"gqa_qkv_rope": gqa_qkv_rope, "gqa_attn": gqa_attn}
