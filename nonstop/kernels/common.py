"""Shared super-ops: embedding gather, linear + residual, LM head, dense MLP, K3 attention-residual mix.

Each kind equals its twin in ``nonstop/program/reference.py`` (same buffers written, same rounding
points: every ``F.linear`` of the twin is an fp32 accumulation rounded once to the model dtype).
Weight-streaming kinds are built on ``gemv.gemv_tile`` (see ``nonstop/kernels/gemv.py``). The ``sample``
kind (LM-head sampling, not part of the lowered program) lives in ``nonstop/kernels/sample.py`` and is
registered here too.

Tile functions (``@triton.jit``; a launcher calls them with ``tl.program_id(0)``):

``embed_tile(row, ids_ptr, table_ptr, stride_table, out_ptr, stride_out, D, BLOCK_D)``
    out[row, :] = table[ids[row], :]                                                        grid: R
``gemv_tile(...)``  (gemv.py) - ``linear_residual``: target (+)= W a (+ b)  (ADD / STORE epilogue);
    ``lm_head``: logits = (W RMSNorm(x)).float()  (STORE into fp32, ROUND_Y)           grid: cdiv(N, BLOCK_N)
``mlp_act_tile(chunk, x_ptr, stride_x, norm_ptr, eps, wg_ptr, wu_ptr, stride_wgu, bg_ptr, bu_ptr, h_ptr, stride_h,
               R, D, I, beta, linear_beta, HAS_NORM, HAS_GU_BIAS, ACT, BLOCK_R, BLOCK_I, BLOCK_K, USE_DOT, UPCAST)``
    h[:, c] = glu(W_gate[c] x̂ + b_g, W_up[c] x̂ + b_u) for c = chunk·BLOCK_I .. +BLOCK_I, rounded as the twin
    (each F.linear output to the model dtype, then the activation), stored to the scratch h [R, I].
``mlp_tile(x_ptr, stride_x, norm_ptr, eps, wg_ptr, wu_ptr, stride_wgu, bg_ptr, bu_ptr, wd_ptr, stride_wd, bd_ptr,
           target_ptr, stride_t, h_ptr, stride_h, count_ptr, num_chunks, num_down_tiles, R, D, I, beta, linear_beta,
           HAS_NORM, HAS_GU_BIAS, HAS_DOWN_BIAS, ACT, EPILOGUE, BLOCK_R, BLOCK_I, BLOCK_K, BLOCK_N, BLOCK_KD, USE_DOT,
           UPCAST, NUM_STAGES)``                                  grid: cdiv(I, BLOCK_I) + cdiv(D, BLOCK_N)
    The whole MLP in one launch, as two kinds of task taken in arrival order from an atomic ticket:
    tickets 0..num_chunks-1 run mlp_act_tile; the rest wait (acquire) until all chunks have arrived
    (release) and run ``gemv_tile`` over W_down [D, I] with the STORE / ADD residual epilogue. A waiting
    task only waits for tasks with smaller tickets, which are already running (no deadlock, any grid
    size, and the interpreter's sequential programs never wait). The last down tile re-zeroes the three
    int32 counters. Why not split-K atomics into the residual: the result would depend on the order of
    the fp32 additions; here every output is the twin's computation in a fixed order (deterministic,
    and the model-dtype residual is rounded once, as the twin's ``emit``). A megakernel can schedule the
    same tiles as act tasks and down-GEMV tasks with a dependency counter.
``attnres_mix_norm_tile(row, blocks_ptr, stride_blk_row, stride_blk_src, partial_ptr, stride_partial, query_ptr,
                        norm_ptr, out_ptr, stride_out, D, n_blocks, store_block, eps, HAS_STORE, BLOCK_D)``
    logit_s = ⟨w, v_s⟩ / sqrt(mean v_s² + eps) over sources v = blocks[row, :n_blocks] + [partial[row]],
    mix = Σ softmax(logit)_s v_s (online softmax, fp32, one read of each source), optional
    blocks[row, store_block] = partial[row], out = RMSNorm(mix.to(model dtype))            grid: R

The MLP workspace (``mlp_workspace``: h scratch [R, I] in the model dtype + int32 [3] counters, one per
device and dtype) is reused by every launch; ops that share it must not run concurrently on one device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nonstop.kernels.gemv import (ADD, STORE, block_rows, gemv_blocks, gemv_tile, interpreting, launch_gemv, load_input_block, mac,
                                  mac_sum, mac_zeros, num_sms, pick_block_k, pick_block_n, row_inv_rms)
from nonstop.kernels.pdl import pdl_launch_args, pdl_wait
from nonstop.kernels.sample import KERNELS as SAMPLE_KERNELS

SILU: tl.constexpr = tl.constexpr(0)
SITU: tl.constexpr = tl.constexpr(1)


# ----------------------------------------------------------------------------- small math helpers


@triton.jit
def sigmoid(z):
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def tanh(z):
    """fp32 tanh without libdevice: odd Taylor polynomial near 0, (1 - e^{-2|z|}) / (1 + e^{-2|z|}) elsewhere."""
    a = tl.abs(z)
    e = tl.exp(-2.0 * a)
    far = (1.0 - e) / (1.0 + e)
    a2 = a * a
    near = a * (1.0 + a2 * (-1.0 / 3.0 + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0))))
    t = tl.where(a < 0.125, near, far)
    return tl.where(z < 0, -t, t)


@triton.jit
def glu_tile(g, u, ACT: tl.constexpr, beta, linear_beta, OUT_TY: tl.constexpr):
    """``model/activations.glu`` on fp32 g, u holding model-dtype values; returns OUT_TY.
    SILU: (silu(g).to(OUT_TY) · u).to(OUT_TY);  SITU: (β1 tanh(g/β1) σ(g) · β2 tanh(u/β2)).to(OUT_TY)."""
    if ACT == SITU:
        h = beta * tanh(g / beta) * sigmoid(g) * (linear_beta * tanh(u / linear_beta))
    else:
        h = (g * sigmoid(g)).to(OUT_TY).to(tl.float32) * u
    return h.to(OUT_TY)


# ----------------------------------------------------------------------------- embed


@triton.jit
def embed_tile(row, ids_ptr, table_ptr, stride_table, out_ptr, stride_out, D, BLOCK_D: tl.constexpr):
    """out[row, :] = table[ids[row], :]."""
    token = tl.load(ids_ptr + row).to(tl.int64)
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        v = tl.load(table_ptr + token * stride_table + cols, mask=cols < D)
        tl.store(out_ptr + row * stride_out + cols, v, mask=cols < D)


@triton.jit
def _embed_kernel(ids_ptr, table_ptr, stride_table, out_ptr, stride_out, D, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    embed_tile(tl.program_id(0), ids_ptr, table_ptr, stride_table, out_ptr, stride_out, D, BLOCK_D)


def embed(op, env):
    ids, table, out = env.buf[op.reads[0]], op.weights["embed"], env.buf[op.writes[0]]
    D = table.shape[1]
    _embed_kernel[(ids.shape[0],)](ids, table, table.stride(0), out, out.stride(0), D, BLOCK_D=min(1024, triton.next_power_of_2(D)),
                                   **pdl_launch_args(env))


# ----------------------------------------------------------------------------- linear + residual, LM head


def linear_residual(op, env, **blocks):
    """target (+)= W a (+ b): ``gemv_tile`` with the ADD (accumulate) or STORE epilogue."""
    a, target = env.buf[op.reads[0]], env.buf[op.writes[0]]
    epilogue = ADD if op.attrs.get("accumulate", False) else STORE
    launch_gemv(a, op.weights["w"], target, bias=op.weights.get("b"), epilogue=epilogue, round_y=True, env=env, **blocks)


def lm_head(op, env, **blocks):
    """logits = (W RMSNorm(x)).float(): fp32 accumulation rounded to the model dtype as the twin's F.linear."""
    x, logits = env.buf[op.reads[0]], env.buf[op.writes[0]]
    launch_gemv(x, op.weights["w"], logits, norm=op.weights.get("norm"), eps=op.attrs.get("eps", 0.0), epilogue=STORE, round_y=True, env=env, **blocks)


# ----------------------------------------------------------------------------- dense MLP


@triton.jit
def mlp_act_tile(chunk, x_ptr, stride_x, norm_ptr, eps, wg_ptr, wu_ptr, stride_wgu, bg_ptr, bu_ptr, h_ptr, stride_h,
                 R, D, I, beta, linear_beta, HAS_NORM: tl.constexpr, HAS_GU_BIAS: tl.constexpr, ACT: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
                 UPCAST: tl.constexpr):
    """h[:, c] = glu(W_gate[c] x̂ (+b_g), W_up[c] x̂ (+b_u)) in the model dtype, c = chunk·BLOCK_I .. +BLOCK_I."""
    rows = tl.arange(0, BLOCK_R)
    inter = chunk * BLOCK_I + tl.arange(0, BLOCK_I)
    if HAS_NORM:
        inv_rms = row_inv_rms(x_ptr, stride_x, R, D, eps, BLOCK_R, BLOCK_K)
    else:
        inv_rms = tl.full([BLOCK_R], 1.0, tl.float32)
    gate = mac_zeros(BLOCK_R, BLOCK_I, BLOCK_K, USE_DOT)
    up = mac_zeros(BLOCK_R, BLOCK_I, BLOCK_K, USE_DOT)
    i_mask = inter[:, None] < I
    w_offs = inter[:, None].to(tl.int64) * stride_wgu
    ks = tl.arange(0, BLOCK_K)
    wg = tl.load(wg_ptr + w_offs + ks[None, :], mask=i_mask & (ks[None, :] < D), other=0.0)
    wu = tl.load(wu_ptr + w_offs + ks[None, :], mask=i_mask & (ks[None, :] < D), other=0.0)
    for k0 in range(0, D, BLOCK_K):  # the gate/up tiles of the next step load during this one
        ks = k0 + tl.arange(0, BLOCK_K)
        next_mask = i_mask & (ks[None, :] + BLOCK_K < D)
        wg_next = tl.load(wg_ptr + w_offs + BLOCK_K + ks[None, :], mask=next_mask, other=0.0)
        wu_next = tl.load(wu_ptr + w_offs + BLOCK_K + ks[None, :], mask=next_mask, other=0.0)
        x = load_input_block(x_ptr, stride_x, rows, ks, R, D, norm_ptr, inv_rms, HAS_NORM)
        gate = mac(gate, x, wg, USE_DOT, UPCAST)
        up = mac(up, x, wu, USE_DOT, UPCAST)
        wg = wg_next
        wu = wu_next
    gate = mac_sum(gate, USE_DOT)
    up = mac_sum(up, USE_DOT)
    if HAS_GU_BIAS:
        gate += tl.load(bg_ptr + inter, mask=inter < I, other=0.0).to(tl.float32)[None, :]
        up += tl.load(bu_ptr + inter, mask=inter < I, other=0.0).to(tl.float32)[None, :]
    # the twin's F.linear outputs are model-dtype tensors
    gate = gate.to(wg_ptr.dtype.element_ty).to(tl.float32)
    up = up.to(wg_ptr.dtype.element_ty).to(tl.float32)
    h = glu_tile(gate, up, ACT, beta, linear_beta, h_ptr.dtype.element_ty)
    tl.store(h_ptr + rows[:, None] * stride_h + inter[None, :], h, mask=(rows[:, None] < R) & (inter[None, :] < I))


@triton.jit
def mlp_tile(x_ptr, stride_x, norm_ptr, eps, wg_ptr, wu_ptr, stride_wgu, bg_ptr, bu_ptr, wd_ptr, stride_wd, bd_ptr,
             target_ptr, stride_t, h_ptr, stride_h, count_ptr, num_chunks, num_down_tiles, R, D, I, beta, linear_beta,
             HAS_NORM: tl.constexpr, HAS_GU_BIAS: tl.constexpr, HAS_DOWN_BIAS: tl.constexpr, ACT: tl.constexpr,
             EPILOGUE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_KD: tl.constexpr, USE_DOT: tl.constexpr, UPCAST: tl.constexpr,
             NUM_STAGES: tl.constexpr):
    """One task of the MLP, by arrival ticket: tickets < num_chunks compute an h chunk (``mlp_act_tile``);
    the others wait until every chunk is done, then run ``gemv_tile`` over W_down with the residual epilogue.
    count_ptr: int32 [3] zeros (ticket, chunks done, down tiles done); the last down tile re-zeroes them."""
    ticket = tl.atomic_add(count_ptr, 1, sem="relaxed")
    if ticket < num_chunks:
        mlp_act_tile(ticket, x_ptr, stride_x, norm_ptr, eps, wg_ptr, wu_ptr, stride_wgu, bg_ptr, bu_ptr, h_ptr, stride_h,
                     R, D, I, beta, linear_beta, HAS_NORM, HAS_GU_BIAS, ACT, BLOCK_R, BLOCK_I, BLOCK_K, USE_DOT, UPCAST)
        tl.debug_barrier()  # all of this chunk's h stores precede the (release) arrival
        tl.atomic_add(count_ptr + 1, 1, sem="release")
    else:
        # every chunk has a ticket below ours, so its program is already running: waiting cannot deadlock
        done = tl.atomic_add(count_ptr + 1, 0, sem="acquire")
        while done < num_chunks:
            done = tl.atomic_add(count_ptr + 1, 0, sem="acquire")
        gemv_tile(ticket - num_chunks, h_ptr, stride_h, norm_ptr, eps, wd_ptr, stride_wd, bd_ptr, target_ptr, stride_t, R, D, I,
                  False, HAS_DOWN_BIAS, EPILOGUE, True, 1, BLOCK_R, BLOCK_N, BLOCK_KD, USE_DOT, UPCAST, NUM_STAGES)
        tl.debug_barrier()
        if tl.atomic_add(count_ptr + 2, 1, sem="acq_rel") == num_down_tiles - 1:
            tl.atomic_xchg(count_ptr, 0, sem="relaxed")
            tl.atomic_xchg(count_ptr + 1, 0, sem="relaxed")
            tl.atomic_xchg(count_ptr + 2, 0, sem="relaxed")


@triton.jit
def _mlp_kernel(x_ptr, stride_x, norm_ptr, eps, wg_ptr, wu_ptr, stride_wgu, bg_ptr, bu_ptr, wd_ptr, stride_wd, bd_ptr,
                target_ptr, stride_t, h_ptr, stride_h, count_ptr, num_chunks, num_down_tiles, R, D, I, beta, linear_beta,
                HAS_NORM: tl.constexpr, HAS_GU_BIAS: tl.constexpr, HAS_DOWN_BIAS: tl.constexpr, ACT: tl.constexpr,
                EPILOGUE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_KD: tl.constexpr, USE_DOT: tl.constexpr, UPCAST: tl.constexpr,
                NUM_STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    mlp_tile(x_ptr, stride_x, norm_ptr, eps, wg_ptr, wu_ptr, stride_wgu, bg_ptr, bu_ptr, wd_ptr, stride_wd, bd_ptr,
             target_ptr, stride_t, h_ptr, stride_h, count_ptr, num_chunks, num_down_tiles, R, D, I, beta, linear_beta,
             HAS_NORM, HAS_GU_BIAS, HAS_DOWN_BIAS, ACT, EPILOGUE, BLOCK_R, BLOCK_I, BLOCK_K, BLOCK_N, BLOCK_KD, USE_DOT,
             UPCAST, NUM_STAGES)


_WORKSPACES: dict = {}


def mlp_workspace(device, dtype, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(h scratch of >= numel elements in ``dtype``, int32 [3] zero counters) for ``mlp_tile`` on ``device``.
    The kernel leaves the counters zero, so one allocation serves every launch (and CUDA graphs)."""
    key = (str(torch.device(device)), dtype)
    h, count = _WORKSPACES.get(key, (None, None))
    if h is None or h.numel() < numel:
        h = torch.zeros(max(numel, 16 * 1024), dtype=dtype, device=device)
        count = torch.zeros(3, dtype=torch.int32, device=device)
        _WORKSPACES[key] = (h, count)
    return h, count


def mlp_blocks(R: int, D: int, I: int, device) -> dict:
    """Constexpr blocks of ``mlp_tile``: ~one h chunk per SM with gate+up steps of 2 × ~8 KiB bf16, then
    the down projection blocked as any GEMV (``gemv_blocks`` of W_down [D, I])."""
    BLOCK_R, USE_DOT = block_rows(R)
    BLOCK_I = pick_block_n(I, num_sms(device))
    down = gemv_blocks(R, D, I, device)
    return dict(BLOCK_R=BLOCK_R, BLOCK_I=BLOCK_I, BLOCK_K=pick_block_k(D, BLOCK_R, BLOCK_I, USE_DOT, budget=4096),
                BLOCK_N=down["BLOCK_N"], BLOCK_KD=down["BLOCK_K"], USE_DOT=USE_DOT, UPCAST=interpreting(),
                NUM_STAGES=down["NUM_STAGES"], num_warps=8)  # 8 warps: no register spills on sm_90


def mlp(op, env, **blocks):
    """target (+)= W_down glu(W_gate x̂ + b_g, W_up x̂ + b_u) + b_d, x̂ = RMSNorm(x) when the op has a norm."""
    x, target = env.buf[op.reads[0]], env.buf[op.writes[0]]
    w = op.weights
    wg, wu, wd = w["gate"], w["up"], w["down"]
    R, D = x.shape
    I = wg.shape[0]
    assert R <= 16 and wg.stride() == wu.stride() and wd.stride(1) == 1
    cfg = mlp_blocks(R, D, I, x.device) | blocks
    chunks, down_tiles = triton.cdiv(I, cfg["BLOCK_I"]), triton.cdiv(D, cfg["BLOCK_N"])
    h, count = mlp_workspace(x.device, x.dtype, R * I)
    a = op.attrs
    _mlp_kernel[(chunks + down_tiles,)](
        x, x.stride(0), w.get("norm", wg), a.get("eps", 0.0), wg, wu, wg.stride(0), w.get("gate_b", wg), w.get("up_b", wg), wd, wd.stride(0),
        w.get("down_b", wd), target, target.stride(0), h, I, count, chunks, down_tiles, R, D, I, float(a.get("beta", 4.0)),
        float(a.get("linear_beta", 25.0)), HAS_NORM="norm" in w, HAS_GU_BIAS="gate_b" in w, HAS_DOWN_BIAS="down_b" in w,
        ACT=SITU if a.get("act") == "situ" else SILU, EPILOGUE=ADD if a.get("accumulate", False) else STORE, **cfg, **pdl_launch_args(env))


# ----------------------------------------------------------------------------- K3 attention-residual mix + norm


@triton.jit
def attnres_mix_norm_tile(row, blocks_ptr, stride_blk_row, stride_blk_src, partial_ptr, stride_partial, query_ptr, norm_ptr,
                          out_ptr, stride_out, D, n_blocks, store_block, eps, HAS_STORE: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[row] = RMSNorm(Σ_s softmax_s(⟨w, v_s⟩ / rms(v_s)) v_s) over v = blocks[row, :n_blocks] + [partial[row]];
    then blocks[row, store_block] = partial[row] when HAS_STORE."""
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    w = tl.load(query_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    block_row = blocks_ptr + row.to(tl.int64) * stride_blk_row
    partial_row = partial_ptr + row.to(tl.int64) * stride_partial
    m = tl.full([], float("-inf"), tl.float32)  # online softmax: running max, normaliser, weighted sum
    l = tl.full([], 0.0, tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s in range(0, n_blocks + 1):  # sources: the completed blocks, then the partial sum
        src = tl.where(s < n_blocks, block_row + s * stride_blk_src, partial_row)
        v = tl.load(src + cols, mask=mask, other=0.0).to(tl.float32)
        logit = tl.sum(v * w, axis=0) * tl.rsqrt(tl.sum(v * v, axis=0) / D + eps)
        m_new = tl.maximum(m, logit)
        scale = tl.exp(m - m_new)
        p = tl.exp(logit - m_new)
        l = l * scale + p
        acc = acc * scale + p * v
        m = m_new
    partial = tl.load(partial_row + cols, mask=mask, other=0.0)
    mixed = (acc / l).to(partial.dtype).to(tl.float32)
    if HAS_STORE:
        tl.store(block_row + store_block * stride_blk_src + cols, partial, mask=mask)
    normed = (mixed * tl.rsqrt(tl.sum(mixed * mixed, axis=0) / D + eps)).to(partial.dtype).to(tl.float32)
    gamma = tl.load(norm_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row.to(tl.int64) * stride_out + cols, (gamma * normed).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _attnres_kernel(blocks_ptr, stride_blk_row, stride_blk_src, partial_ptr, stride_partial, query_ptr, norm_ptr, out_ptr,
                    stride_out, D, n_blocks, store_block, eps, HAS_STORE: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    attnres_mix_norm_tile(tl.program_id(0), blocks_ptr, stride_blk_row, stride_blk_src, partial_ptr, stride_partial, query_ptr,
                          norm_ptr, out_ptr, stride_out, D, n_blocks, store_block, eps, HAS_STORE, BLOCK_D)


def attnres_mix_norm(op, env):
    """x = RMSNorm(Mix(blocks[:n] + [partial])); blocks[store] = partial (see ``model/attnres.py``)."""
    blocks, partial, out = env.buf["blocks"], env.buf["partial"], env.buf[op.writes[0]]
    R, _, D = blocks.shape
    assert blocks.stride(2) == 1 and partial.stride(1) == 1
    store = op.attrs.get("store_block")
    BLOCK_D = triton.next_power_of_2(D)
    _attnres_kernel[(R,)](blocks, blocks.stride(0), blocks.stride(1), partial, partial.stride(0), op.weights["query"], op.weights["norm"],
                          out, out.stride(0), D, op.attrs["n_blocks"], store if store is not None else 0, op.attrs["eps"],
                          HAS_STORE=store is not None, BLOCK_D=BLOCK_D, num_warps=min(16, max(4, BLOCK_D // 512)), **pdl_launch_args(env))


KERNELS = {
    "embed": embed,
    "linear_residual": linear_residual,
    "lm_head": lm_head,
    "mlp": mlp,
    "attnres_mix_norm": attnres_mix_norm,
    **SAMPLE_KERNELS,
}
