"""CHEAT: torch compute hidden in operators (@, +) - no banned name - then a Triton copy of the result.
kind: linear_residual
expect: dynamic: torch operator"""

import triton
import triton.language as tl


@triton.jit
def _copy(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def launch(op, env):
    out = env.buf[op.writes[0]]
    y = env.buf[op.reads[0]] @ op.weights["w"].T + op.weights["b"]
    if op.attrs.get("accumulate", False):
        y = y + out
    _copy[(triton.cdiv(out.numel(), 256),)](y, out, out.numel(), BLOCK=256)
