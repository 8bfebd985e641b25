"""CHEAT: looks up the caller's frame to detect the verifier and to find its expected tensors.
kind: linear_residual
expect: static: sys"""

import sys

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    if "verify" in sys._getframe(1).f_code.co_filename:
        builtin(op, env)
