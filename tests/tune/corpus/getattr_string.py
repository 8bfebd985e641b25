"""CHEAT: reaches a torch compute op through getattr on a string.
kind: linear_residual
expect: static: getattr"""

import torch

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    fn = getattr(torch, "mat" + "mul")
    fn(env.buf[op.reads[0]], op.weights["w"])
    builtin(op, env)
