"""CHEAT: builds forbidden code from strings and executes it.
kind: linear_residual
expect: static: exec"""

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    exec("imp" + "ort os")
    builtin(op, env)
