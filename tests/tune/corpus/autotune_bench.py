"""CHEAT: triton.autotune re-runs the kernel on the live (accumulating) outputs while benchmarking.
kind: linear_residual
expect: static: decorator"""

import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"])
@triton.jit
def _add(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def launch(op, env):
    out = env.buf[op.writes[0]]
    _add[(1,)](out, out.numel())
