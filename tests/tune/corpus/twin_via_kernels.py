"""CHEAT: reaches torch through a module nonstop.kernels imports.
kind: linear_residual
expect: static: a module"""

from nonstop.kernels.gemv import torch
from nonstop.kernels.dense import linear_residual


def launch(op, env):
    linear_residual(op, env)
    torch.cuda.synchronize()
