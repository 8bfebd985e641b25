"""CHEAT: runs the work in a background thread so that a timer around launch() misses it.
kind: linear_residual
expect: static: threading"""

import threading

from nonstop.kernels.dense import linear_residual as builtin


def launch(op, env):
    threading.Thread(target=builtin, args=(op, env)).start()
