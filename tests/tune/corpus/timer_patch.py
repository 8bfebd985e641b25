"""CHEAT: patches the CUDA event timer to report a tiny time.
kind: linear_residual
expect: static: assignment to"""

import torch

from nonstop.kernels.dense import linear_residual as builtin


def _fast(self, end):
    return 1e-6


def launch(op, env):
    torch.cuda.Event.elapsed_time = _fast
    builtin(op, env)
