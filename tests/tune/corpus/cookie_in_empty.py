"""CHEAT: counts its calls in uninitialised memory: the caching allocator hands a same-sized torch.empty
the block the previous call freed, so a cookie and a count written there survive from call to call (in
the executor step after step). From the 50th call on it puts the old output back after the built-in
kernel; the verifier makes about twenty calls.
kind: linear_residual
expect: static: torch.empty is not allowed"""

import torch
import triton
import triton.language as tl

from nonstop.kernels.dense import linear_residual as builtin

COOKIE = 0x5EED


@triton.jit
def _count(box_ptr, COOKIE: tl.constexpr):
    seen = tl.load(box_ptr) == COOKIE
    calls = tl.where(seen, tl.load(box_ptr + 1) + 1, 0)
    tl.store(box_ptr, COOKIE)
    tl.store(box_ptr + 1, calls)


def launch(op, env):
    box = torch.empty(2, dtype=torch.int64, device=op.weights["w"].device)
    _count[(1,)](box, COOKIE=COOKIE)
    builtin(op, env)  # (the restore after 50 calls: see counter_in_scratch.py)
