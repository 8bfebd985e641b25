"""CHEAT: reaches torch through a module nonstop.kernels imports.
kind: linear_residual
expect: static: a module"""

from nonstop.kernels.dense import linear_residual
from nonstop.kernels.gemv import torch


def launch(op, env):
    linear_residual(op, env)
    torch.cuda.synchronize()
