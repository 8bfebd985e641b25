"""CHEAT: precision downgrade - the fp32 model's product is stored in half precision (half the bytes
written) before the residual add.
kind: linear_residual
expect: dynamic: differ from the twin"""

import torch
import triton
import triton.language as tl

from nonstop.kernels.gemv import launch_gemv


@triton.jit
def _add_rows(y_ptr, out_ptr, n, ACCUMULATE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    y = tl.load(y_ptr + offs, mask=offs < n).to(tl.float32)
    if ACCUMULATE:
        y += tl.load(out_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, y, mask=offs < n)


def launch(op, env):
    a, out = env.buf[op.reads[0]], env.buf[op.writes[0]]
    y = torch.zeros(out.shape, dtype=torch.float16, device=out.device)
    launch_gemv(a, op.weights["w"], y, bias=op.weights.get("b"), env=env)
    _add_rows[(triton.cdiv(out.numel(), 128),)](
        y, out, out.numel(), ACCUMULATE=op.attrs.get("accumulate", False), BLOCK=128
    )
