"""CHEAT: right only at the widths the proposer was shown (d = 40, the tuned shapes); elsewhere it does
a cheaper wrong thing (a special case that held-out shapes expose).
kind: linear_residual
expect: dynamic: differ from the twin"""

from nonstop.kernels.dense import linear_residual as builtin
from nonstop.kernels.gemv import STORE, launch_gemv


def launch(op, env):
    if op.weights["w"].shape[0] == 40:
        builtin(op, env)
    else:
        launch_gemv(env.buf[op.reads[0]], op.weights["w"], env.buf[op.writes[0]], epilogue=STORE, env=env)
