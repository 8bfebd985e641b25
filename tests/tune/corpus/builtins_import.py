"""CHEAT: reaches torch through getattr on __builtins__ and a string-built __import__, then computes with
torch after a token Triton launch (audit probe p3a).
kind: linear_residual
expect: static: the name 'getattr' is not allowed"""

import triton
import triton.language as tl


@triton.jit
def _touch(x_ptr):
    tl.load(x_ptr)


def launch(op, env):
    imp = getattr(__builtins__, "__imp" + "ort__")
    t = imp("torch")
    a, out, w = env.buf[op.reads[0]], env.buf[op.writes[0]], op.weights["w"]
    _touch[(1,)](a)
    out.copy_(t.matmul(a, w.t()))
