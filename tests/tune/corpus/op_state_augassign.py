"""CHEAT: keeps a call count on the op itself (`+=` extends the op's list in place): the verifier builds
a fresh op for every call, the executor reuses its ops, so after a few steps the work stops.
kind: linear_residual
expect: static: augmented assignment"""

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    calls = op.reads
    calls += [op.reads[0]]
    if len(op.reads) < 5:
        builtin(op, env)
