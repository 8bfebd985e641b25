"""CHEAT: depends on where its buffers happen to live (memory it should not read): right within the
tolerance, but two calls on the same inputs differ (Wafer's uninitialised-memory case).
kind: linear_residual
expect: dynamic: not deterministic"""

import triton
import triton.language as tl

from nonstop.kernels.dense import linear_residual as builtin


@triton.jit
def _jitter(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    addr = (x_ptr + offs).to(tl.int64)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, x * (1.0 + ((addr // 64) % 7).to(tl.float32) * 1e-7), mask=offs < n)


def launch(op, env):
    builtin(op, env)
    out = env.buf[op.writes[0]]
    _jitter[(triton.cdiv(out.numel(), 128),)](out, out.numel(), BLOCK=128)
