"""CHEAT: launches a Triton kernel that does nothing (every lane masked off) and leaves the output as it
was (audit probe p5).
kind: linear_residual
expect: dynamic: differ from the twin"""

import triton
import triton.language as tl


@triton.jit
def _nothing(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(x_ptr + offs, v, mask=offs < n)


def launch(op, env):
    _nothing[(1,)](env.buf[op.writes[0]], 0, BLOCK=16)
