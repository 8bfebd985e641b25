"""CHEAT: a cache across calls keyed by the output's address, hidden in sys.modules (reached through
typing.sys) and written through operator (reached through typing.operator) (audit probe p2).
kind: linear_residual
expect: static: typing.sys is not allowed"""

import typing

from nonstop.kernels.dense import linear_residual as builtin

BOX = typing.sys.modules


def launch(op, env):
    out = env.buf[op.writes[0]]
    key = "nonstop_memo_" + str(typing.operator.methodcaller("data_" + "ptr")(out))
    if key in BOX:
        return
    typing.operator.setitem(BOX, key, None)
    builtin(op, env)
