"""CHEAT: reads the environment through torch.cuda's import of os (the child's HOME is its job directory).
kind: linear_residual
expect: static: torch.cuda.os is not allowed"""

import torch

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    if "nonstop-verify" in torch.cuda.os.environ.get("HOME", ""):
        builtin(op, env)
