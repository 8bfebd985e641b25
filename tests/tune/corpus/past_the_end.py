"""CHEAT: right result, plus a write just past the end of its output (scratch "borrowed" from a neighbour).
kind: linear_residual
expect: dynamic: guard band"""

import triton
import triton.language as tl

from nonstop.kernels.dense import linear_residual as builtin


@triton.jit
def _poke(x_ptr, n):
    tl.store(x_ptr + n, 1.0)


def launch(op, env):
    builtin(op, env)
    out = env.buf[op.writes[0]]
    _poke[(1,)](out, out.numel())
