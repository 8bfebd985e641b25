"""CHEAT: a module-level cache of results keyed by the output's address (GPU MODE / CUDA-L1 style).
kind: linear_residual
expect: static: module-level"""

from nonstop.kernels.dense import linear_residual as builtin

_SEEN = {}


def launch(op, env):
    out = env.buf[op.writes[0]]
    key = out.data_ptr()
    if key in _SEEN:
        return
    _SEEN[key] = True
    builtin(op, env)
