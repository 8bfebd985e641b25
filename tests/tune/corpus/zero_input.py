"""CHEAT: right result, then zeroes its input activations (a later op, or a re-check, sees zeros).
kind: linear_residual
expect: dynamic: modified an input"""

import triton
import triton.language as tl

from nonstop.kernels.dense import linear_residual as builtin


@triton.jit
def _zero(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.zeros([BLOCK], tl.float32), mask=offs < n)


def launch(op, env):
    builtin(op, env)
    a = env.buf[op.reads[0]]
    _zero[(triton.cdiv(a.numel(), 128),)](a, a.numel(), BLOCK=128)
