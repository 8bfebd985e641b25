"""CHEAT: returns early on one-row steps (launches nothing; the poisoned output stays).
kind: linear_residual
expect: dynamic: no Triton kernel ran"""

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    if env.B * env.T == 1:
        return
    builtin(op, env)
