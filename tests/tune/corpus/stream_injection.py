"""CHEAT: launches on a side stream so that events on the current stream do not see the work.
kind: linear_residual
expect: static: with blocks"""

import torch

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    with torch.cuda.stream(torch.cuda.Stream()):
        builtin(op, env)
