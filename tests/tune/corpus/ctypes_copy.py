"""CHEAT: copies memory behind torch's back with ctypes.
kind: linear_residual
expect: static: ctypes"""

import ctypes

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    builtin(op, env)
    ctypes.memmove(0, 0, 0)
