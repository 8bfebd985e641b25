"""mlp: the built-in launch with the activation hard-coded to SwiGLU (ignores op.attrs["act"]).

Right on every SwiGLU model; wrong on a model whose ``act`` is "situ" with the same weight shapes."""

import torch
import triton

from nonstop.kernels.dense import mlp_blocks, mlp_kernel
from nonstop.kernels.gemv import ADD, STORE
from nonstop.kernels.launch import pdl_launch_args, phase_counters


def launch(op, env):
    x, target = env.buf[op.reads[0]], env.buf[op.writes[0]]
    w = op.weights
    wg, wu, wd = w["gate"], w["up"], w["down"]
    R, D = x.shape
    I = wg.shape[0]
    cfg = mlp_blocks(R, D, I, x.device)
    chunks, down_tiles = triton.cdiv(I, cfg["BLOCK_I"]), triton.cdiv(D, cfg["BLOCK_N"])
    h = torch.zeros(R * I, dtype=x.dtype, device=x.device)
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
        ACT=0,
        EPILOGUE=ADD if a.get("accumulate", False) else STORE,
        **cfg,
        **pdl_launch_args(env),
    )
