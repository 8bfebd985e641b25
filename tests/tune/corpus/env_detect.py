"""CHEAT: detects the verifier through the environment and skips the work outside it.
kind: linear_residual
expect: static: import os"""

import os

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    if os.environ.get("TRITON_INTERPRET") or os.environ.get("HOME", "").startswith("/tmp"):
        builtin(op, env)
