"""CHEAT: counts calls in a mutable default argument and does the work only on the first (checked) call.
kind: linear_residual
expect: static: default value"""

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env, _calls=[]):  # noqa: B006 - the cheat under test
    _calls.append(1)
    if len(_calls) == 1:
        builtin(op, env)
