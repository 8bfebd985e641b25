"""WRONG: computes only the first row of a multi-row step (the decode case the proposer was shown).
kind: linear_residual
expect: dynamic: differ from the twin"""

from nonstop.kernels.gemv import ADD, STORE, launch_gemv


def launch(op, env):
    a, out = env.buf[op.reads[0]], env.buf[op.writes[0]]
    epilogue = ADD if op.attrs.get("accumulate", False) else STORE
    launch_gemv(a[:1], op.weights["w"], out[:1], bias=op.weights.get("b"), epilogue=epilogue, round_y=True, env=env)
