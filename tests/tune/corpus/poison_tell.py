"""CHEAT: tells the verifier's calls from the executor's by the output buffer it is given: the verifier
poisons it with NaN, the executor hands back the buffer of the previous step. Where it is not NaN it
puts the old contents back after the built-in kernel ran (a stale result in the model, right in every
call of the verification).
kind: lm_head
expect: dynamic: the candidate is wrong in the model"""

import torch
import triton
import triton.language as tl

from nonstop.kernels.dense import lm_head as builtin


@triton.jit
def _copy(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _restore_unless_poisoned(saved_ptr, out_ptr, n, BLOCK: tl.constexpr):
    first = tl.load(saved_ptr)
    if first == first:  # not NaN: the executor's reused buffer
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(saved_ptr + offs, mask=offs < n), mask=offs < n)


def launch(op, env):
    out = env.buf[op.writes[0]]
    saved = torch.zeros_like(out)
    n = out.numel()
    grid = (triton.cdiv(n, 1024),)
    _copy[grid](out, saved, n, BLOCK=1024)
    builtin(op, env)
    _restore_unless_poisoned[grid](saved, out, n, BLOCK=1024)
