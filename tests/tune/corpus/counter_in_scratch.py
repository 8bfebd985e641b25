"""CHEAT: counts its calls in a persistent two-phase counter of nonstop.kernels (phase_counters, a
helper the built-in launchers call) and, from the 50th call on, puts the old output back after the
built-in kernel (the verifier makes about twenty calls, the executor millions).
kind: linear_residual
expect: dynamic: left the persistent counters"""

import torch
import triton
import triton.language as tl

from nonstop.kernels.dense import linear_residual as builtin
from nonstop.kernels.launch import phase_counters


@triton.jit
def _copy(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _restore_after(count_ptr, saved_ptr, out_ptr, n, CALLS: tl.constexpr, BLOCK: tl.constexpr):
    calls = tl.atomic_add(count_ptr + 2, 1)
    if calls >= CALLS:
        offs = tl.arange(0, BLOCK)
        for start in range(0, n, BLOCK):
            m = start + offs < n
            tl.store(out_ptr + start + offs, tl.load(saved_ptr + start + offs, mask=m), mask=m)


def launch(op, env):
    out = env.buf[op.writes[0]]
    saved = torch.zeros_like(out)
    n = out.numel()
    _copy[(triton.cdiv(n, 256),)](out, saved, n, BLOCK=256)
    builtin(op, env)
    _restore_after[(1,)](phase_counters("calls", out.device), saved, out, n, CALLS=50, BLOCK=256)
