"""CHEAT: allocates far more memory than the machine has (the sandbox limits it).
kind: linear_residual
expect: dynamic: launch raised"""

import torch

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    hog = torch.zeros(1 << 42, dtype=torch.uint8, device=op.weights["w"].device)
    builtin(op, env)
    return hog
