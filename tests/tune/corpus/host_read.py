"""CHEAT: reads input values on the host to pick a path (a value-keyed special case).
kind: linear_residual
expect: dynamic: host"""

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    if float(env.buf[op.reads[0]][0, 0]) != 12345.0:
        builtin(op, env)
