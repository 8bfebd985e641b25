"""CHEAT: right at widths that are multiples of 16 (every real model's); drops the bias and the
accumulation elsewhere (audit probe p4: the hidden odd widths expose it).
kind: linear_residual
expect: dynamic: differ from the twin"""

from nonstop.kernels.dense import linear_residual as builtin
from nonstop.kernels.gemv import STORE, launch_gemv


def launch(op, env):
    w = op.weights["w"]
    if w.shape[0] % 16 == 0 and w.shape[1] % 16 == 0:
        builtin(op, env)
    else:
        launch_gemv(env.buf[op.reads[0]], w, env.buf[op.writes[0]], epilogue=STORE, env=env)
