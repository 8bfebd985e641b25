"""The dense super-ops: embedding gather, linear + residual, LM head, dense MLP (K3's attention-residual
mix: ``attnres.py``).

Each kind equals its twin in ``nonstop/program/reference.py`` (same buffers written, same rounding
points: every ``F.linear`` of the twin is an fp32 accumulation rounded once to the model dtype).
Weight-streaming kinds are built on the GEMV tile (``gemv.py``); launchers are generated from the tile
functions (``launch.py``).

Tile functions:

``embed_tile(row, ids_ptr, table_ptr, stride_table, out_ptr, stride_out, D, BLOCK_D)``
    out[row, :] = table[ids[row], :]                                                        tiles: R
``gemv_tile`` (gemv.py) - ``linear_residual``: target (+)= W a (+ b) (ADD / STORE epilogue);
    ``lm_head``: logits = (W RMSNorm(x)).float() (STORE into fp32, ROUND_Y)          tiles: cdiv(N, BLOCK_N)
``mlp_tile(tile, ..., PHASE)``  target (+)= W_down glu(W_gate x̂ + b_g, W_up x̂ + b_u) + b_d, two phases:
    1 ``gate_up``: h[:, c] = glu(...) for c = tile·BLOCK_I .. +BLOCK_I, each F.linear output rounded to
      the model dtype, then the activation; stored to the scratch h [R, I]        tiles: cdiv(I, BLOCK_I)
    2 ``down``: ``gemv_tile`` over W_down [D, I] with the STORE / ADD residual epilogue  tiles: cdiv(D, BLOCK_N)
    Why not split-K atomics into the residual: the result would depend on the order of the fp32
    additions; here every output is the twin's computation in a fixed order (deterministic).

The MLP's h scratch (``launch.workspace``, one per device and dtype) is reused by every launch; ops that
share it must not run concurrently on one device.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nonstop.kernels.activations import act_code, glu_tile
from nonstop.kernels.gemv import (
    ADD,
    STORE,
    gemv_blocks,
    gemv_rows,
    gemv_tile,
    launch_gemv,
    pick_block_k,
    pick_block_n,
    row_inv_rms,
)
from nonstop.kernels.launch import (
    launcher,
    pdl_launch_args,
    phase_counters,
    phase_done,
    phase_ticket,
    require_unit_columns,
    workspace,
)
from nonstop.kernels.platform import num_sms, pipeline_stages, pow2, row_block, upcast_dots

# ----------------------------------------------------------------------------- embed


@triton.jit
def embed_tile(row, ids_ptr, table_ptr, stride_table, out_ptr, stride_out, D, BLOCK_D: tl.constexpr):
    """out[row, :] = table[ids[row], :]."""
    token = tl.load(ids_ptr + row).to(tl.int64)
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        v = tl.load(table_ptr + token * stride_table + cols, mask=cols < D)
        tl.store(out_ptr + row * stride_out + cols, v, mask=cols < D)


embed_kernel = launcher(embed_tile)


def embed(op, env):
    ids, table, out = env.buf[op.reads[0]], op.weights["embed"], env.buf[op.writes[0]]
    require_unit_columns("embed", embed=table, out=out)
    D = table.shape[1]
    BLOCK_D = min(2048, pow2(D))
    # warps whose threads each read 16 bytes of a BLOCK_D block (one ld.global.v4), at most 4: a narrow row
    # (256 bf16 = 512 bytes) over 4 warps would give each thread 4 bytes
    warps = max(1, min(4, BLOCK_D * table.element_size() // (16 * 32)))
    embed_kernel[(ids.shape[0],)](
        ids, table, table.stride(0), out, out.stride(0), D, BLOCK_D=BLOCK_D, num_warps=warps, **pdl_launch_args(env)
    )


# ----------------------------------------------------------------------------- linear + residual, LM head


def linear_residual(op, env, **blocks):
    """target (+)= W a (+ b): ``gemv_tile`` with the ADD (accumulate) or STORE epilogue."""
    a, target = env.buf[op.reads[0]], env.buf[op.writes[0]]
    epilogue = ADD if op.attrs.get("accumulate", False) else STORE
    launch_gemv(
        a, op.weights["w"], target, bias=op.weights.get("b"), epilogue=epilogue, round_y=True, env=env, **blocks
    )


def lm_head(op, env, **blocks):
    """logits = (W RMSNorm(x)).float(): fp32 accumulation rounded to the model dtype as the twin's F.linear."""
    x, logits = env.buf[op.reads[0]], env.buf[op.writes[0]]
    launch_gemv(
        x,
        op.weights["w"],
        logits,
        norm=op.weights.get("norm"),
        eps=op.attrs.get("eps", 0.0),
        epilogue=STORE,
        round_y=True,
        env=env,
        **blocks,
    )


# ----------------------------------------------------------------------------- dense MLP


@triton.jit
def mlp_act_tile(
    chunk,
    x_ptr,
    stride_x,
    norm_ptr,
    eps,
    wg_ptr,
    wu_ptr,
    stride_wgu,
    bg_ptr,
    bu_ptr,
    h_ptr,
    stride_h,
    R,
    D,
    I,
    beta,
    linear_beta,
    HAS_NORM: tl.constexpr,
    HAS_GU_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """h[:, c] = glu(W_gate[c] x̂ (+b_g), W_up[c] x̂ (+b_u)) in the model dtype, c = chunk·BLOCK_I .. +BLOCK_I."""
    DT: tl.constexpr = wg_ptr.dtype.element_ty
    rows = tl.arange(0, BLOCK_R)
    inter = chunk * BLOCK_I + tl.arange(0, BLOCK_I)
    if HAS_NORM:
        inv_rms = row_inv_rms(x_ptr, stride_x, R, D, eps, DT, BLOCK_R, BLOCK_K)
    else:
        inv_rms = tl.full([BLOCK_R], 1.0, tl.float32)
    gate, up = gemv_rows(
        x_ptr,
        stride_x,
        R,
        0,
        D,
        norm_ptr,
        inv_rms,
        wg_ptr,
        wu_ptr,
        stride_wgu,
        wg_ptr,
        wg_ptr,
        0,
        0,
        inter,
        inter,
        inter < I,
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
    if HAS_GU_BIAS:
        gate += tl.load(bg_ptr + inter, mask=inter < I, other=0.0).to(tl.float32)[None, :]
        up += tl.load(bu_ptr + inter, mask=inter < I, other=0.0).to(tl.float32)[None, :]
    gate = gate.to(DT).to(tl.float32)  # the twin's F.linear outputs are model-dtype tensors
    up = up.to(DT).to(tl.float32)
    h = glu_tile(gate, up, ACT, beta, linear_beta, h_ptr.dtype.element_ty)
    tl.store(h_ptr + rows[:, None] * stride_h + inter[None, :], h, mask=(rows[:, None] < R) & (inter[None, :] < I))


@triton.jit
def mlp_tile(
    tile,
    x_ptr,
    stride_x,
    norm_ptr,
    eps,
    wg_ptr,
    wu_ptr,
    stride_wgu,
    bg_ptr,
    bu_ptr,
    wd_ptr,
    stride_wd,
    bd_ptr,
    target_ptr,
    stride_t,
    h_ptr,
    stride_h,
    count_ptr,
    num_chunks,
    num_down_tiles,
    R,
    D,
    I,
    beta,
    linear_beta,
    HAS_NORM: tl.constexpr,
    HAS_GU_BIAS: tl.constexpr,
    HAS_DOWN_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    EPILOGUE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_KD: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PHASE: tl.constexpr,
):
    """A tile of the MLP (module docstring): PHASE 1 an h chunk, 2 a down tile, 0 the in-launch protocol
    (``launch.phase_ticket``; count_ptr int32 [3] zeros)."""
    phase = PHASE
    if PHASE == 0:
        phase, tile = phase_ticket(count_ptr, num_chunks)
    if phase == 1:
        mlp_act_tile(
            tile,
            x_ptr,
            stride_x,
            norm_ptr,
            eps,
            wg_ptr,
            wu_ptr,
            stride_wgu,
            bg_ptr,
            bu_ptr,
            h_ptr,
            stride_h,
            R,
            D,
            I,
            beta,
            linear_beta,
            HAS_NORM,
            HAS_GU_BIAS,
            ACT,
            BLOCK_R,
            BLOCK_I,
            BLOCK_K,
            USE_DOT,
            UPCAST,
            NUM_STAGES,
        )
    else:
        gemv_tile(
            tile,
            h_ptr,
            stride_h,
            norm_ptr,
            eps,
            wd_ptr,
            stride_wd,
            bd_ptr,
            target_ptr,
            stride_t,
            R,
            D,
            I,
            False,
            HAS_DOWN_BIAS,
            EPILOGUE,
            True,
            BLOCK_R,
            BLOCK_N,
            BLOCK_KD,
            USE_DOT,
            UPCAST,
            NUM_STAGES,
        )
    if PHASE == 0:
        phase_done(count_ptr, phase, num_down_tiles)


mlp_kernel = launcher(
    mlp_tile,
    phases=("gate_up", "down"),
    first="num_chunks",
    prefetch=("wg_ptr", "pid * BLOCK_I * stride_wgu", "BLOCK_I * stride_wgu"),
)


def mlp_blocks(R: int, D: int, I: int, device) -> dict:
    """Constexpr blocks of ``mlp_tile``: ~one h chunk per SM with gate+up steps of 2 × ~8 KiB bf16, then
    the down projection blocked as any GEMV (``gemv_blocks`` of W_down [D, I])."""
    BLOCK_R, USE_DOT = row_block(R)
    BLOCK_I = pick_block_n(I, num_sms(device))
    down = gemv_blocks(R, D, I, device)
    return dict(
        BLOCK_R=BLOCK_R,
        BLOCK_I=BLOCK_I,
        BLOCK_K=pick_block_k(D, BLOCK_R, BLOCK_I, USE_DOT, budget=4096),
        BLOCK_N=down["BLOCK_N"],
        BLOCK_KD=down["BLOCK_K"],
        USE_DOT=USE_DOT,
        UPCAST=upcast_dots(),
        NUM_STAGES=pipeline_stages(),
        num_warps=8,
    )


def mlp(op, env, **blocks):
    """target (+)= W_down glu(W_gate x̂ + b_g, W_up x̂ + b_u) + b_d, x̂ = RMSNorm(x) when the op has a norm."""
    x, target = env.buf[op.reads[0]], env.buf[op.writes[0]]
    w = op.weights
    wg, wu, wd = w["gate"], w["up"], w["down"]
    R, D = x.shape
    I = wg.shape[0]
    assert R <= 16 and wg.stride() == wu.stride()
    require_unit_columns("mlp", x=x, out=target, gate=wg, up=wu, down=wd)
    cfg = mlp_blocks(R, D, I, x.device) | blocks
    chunks, down_tiles = triton.cdiv(I, cfg["BLOCK_I"]), triton.cdiv(D, cfg["BLOCK_N"])
    h = workspace("mlp.h", R * I, x.dtype, x.device)
    a = op.attrs
    mlp_kernel[(chunks + down_tiles,)](
        x,
        x.stride(0),
        w.get("norm", wg),
        a.get("eps", 0.0),
        wg,
        wu,
        wg.stride(0),
        w.get("gate_b", wg),
        w.get("up_b", wg),
        wd,
        wd.stride(0),
        w.get("down_b", wd),
        target,
        target.stride(0),
        h,
        I,
        phase_counters("mlp", x.device),
        chunks,
        down_tiles,
        R,
        D,
        I,
        float(a["beta"]),
        float(a["linear_beta"]),
        HAS_NORM="norm" in w,
        HAS_GU_BIAS="gate_b" in w,
        HAS_DOWN_BIAS="down_b" in w,
        ACT=act_code(a.get("act")),
        EPILOGUE=ADD if a.get("accumulate", False) else STORE,
        **cfg,
        **pdl_launch_args(env),
    )


KERNELS = {
    "embed": embed,
    "linear_residual": linear_residual,
    "lm_head": lm_head,
    "mlp": mlp,
}
