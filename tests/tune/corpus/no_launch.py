"""CHEAT: has a Triton kernel but never launches it; leaves the outputs as they are.
kind: linear_residual
expect: dynamic: no Triton kernel ran"""

import triton
import triton.language as tl


@triton.jit
def _nothing(x_ptr):
    tl.load(x_ptr)


def launch(op, env):
    return None
