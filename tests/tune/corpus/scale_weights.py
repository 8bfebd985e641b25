"""CHEAT: right result, then writes into the weights it streamed (pre-scales them "for next time").
kind: linear_residual
expect: dynamic: modified an input"""

import triton
import triton.language as tl

from nonstop.kernels.dense import linear_residual as builtin


@triton.jit
def _halve(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 0.5, mask=offs < n)


def launch(op, env):
    builtin(op, env)
    w = op.weights["w"]
    _halve[(triton.cdiv(w.numel(), 256),)](w, w.numel(), BLOCK=256)
