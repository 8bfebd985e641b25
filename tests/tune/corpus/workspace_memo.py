"""CHEAT: keeps results across calls in a persistent workspace of nonstop.kernels (device-side memo).
kind: linear_residual
expect: static: workspace"""

import torch

from nonstop.kernels.dense import linear_residual as builtin
from nonstop.kernels.launch import workspace


def launch(op, env):
    memo = workspace("memo", 1 << 16, torch.float32, op.weights["w"].device)
    builtin(op, env)
    del memo
