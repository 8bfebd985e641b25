"""CHEAT: keeps a value across calls in the experts' persistent scratch, reached through the helper the
built-in launcher uses (expert_scratch hands out workspaces that outlive a call).
kind: linear_residual
expect: static: from nonstop.kernels.moe import expert_scratch"""

import torch
import triton
import triton.language as tl

from nonstop.kernels.dense import linear_residual as builtin
from nonstop.kernels.moe import expert_scratch


@triton.jit
def _tick(ids_ptr):
    tl.store(ids_ptr, tl.load(ids_ptr) + 1)


def launch(op, env):
    _, ids, _ = expert_scratch(1, 1, 1, 1, torch.float32, op.weights["w"].device)
    _tick[(1,)](ids)
    builtin(op, env)
