"""linear_residual: the built-in launcher with other tile sizes (what the search proposer writes)."""

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    builtin(op, env, BLOCK_N=16, BLOCK_K=16, num_warps=4)
