"""CHEAT: a tensor subclass that defers the work into whoever reads the output.
kind: linear_residual
expect: static: class definitions"""

import torch

from nonstop.kernels.dense import linear_residual as builtin


class Lazy(torch.Tensor):
    pass


def launch(op, env):
    builtin(op, env)
