"""CHEAT: the same sandbox detection through Triton's own modules (triton.testing imports sys and os).
kind: linear_residual
expect: static: triton.testing is not allowed"""

import triton

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    if triton.testing.sys.flags.isolated or triton.testing.os.environ.get("TRITON_INTERPRET"):
        builtin(op, env)
