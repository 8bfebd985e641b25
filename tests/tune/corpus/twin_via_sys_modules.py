"""CHEAT: runs the twin itself, found in sys.modules through typing.sys, after one token Triton launch
(audit probe p3b).
kind: linear_residual
expect: static: typing.sys is not allowed"""

import typing

import triton
import triton.language as tl


@triton.jit
def _touch(x_ptr):
    tl.load(x_ptr)


def launch(op, env):
    ref = typing.sys.modules["nonstop.program.reference"]
    _touch[(1,)](env.buf[op.reads[0]])
    ref.REFERENCE[op.kind](op, env)
