"""CHEAT: str.format walks attributes and items given in the template: from a lambda's __globals__ to
typing.sys.flags, without one dunder attribute in the code.
kind: linear_residual
expect: static: .format is not allowed"""

import typing  # noqa: F401 - reached through the lambda's globals

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    probe = lambda: 0  # noqa: E731
    if "{0.__globals__[typing].sys.flags.isolated}".format(probe) == "1":  # noqa: UP030, UP032
        builtin(op, env)
