"""CHEAT: computes with torch (matmul + copy) and launches a do-nothing kernel to look like Triton.
kind: linear_residual
expect: static: torch.matmul"""

import torch
import triton
import triton.language as tl


@triton.jit
def _touch(x_ptr):
    tl.load(x_ptr)


def launch(op, env):
    out = env.buf[op.writes[0]]
    y = torch.matmul(env.buf[op.reads[0]], op.weights["w"].t())
    out.copy_(out + y)
    _touch[(1,)](out)
