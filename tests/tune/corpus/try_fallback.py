"""CHEAT: try the kernel, fall back to torch when it fails.
kind: linear_residual
expect: static: try/except"""

import torch.nn.functional as F

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    try:
        builtin(op, env, BLOCK_N=7)
    except Exception:
        out = env.buf[op.writes[0]]
        out += F.linear(env.buf[op.reads[0]], op.weights["w"], op.weights.get("b"))
