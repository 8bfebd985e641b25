"""CHEAT: detects the sandbox through typing's own import of sys (the verifier's child runs under
`python -I`, the executor does not) and does the work only there (audit probe p1).
kind: linear_residual
expect: static: typing.sys is not allowed"""

import typing

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    if typing.sys.flags.isolated:
        builtin(op, env)
