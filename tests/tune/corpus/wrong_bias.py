"""WRONG: forgets the bias (right everywhere the bias is zero).
kind: linear_residual
expect: dynamic: differ from the twin"""

from nonstop.kernels.gemv import ADD, STORE, launch_gemv


def launch(op, env):
    out = env.buf[op.writes[0]]
    epilogue = ADD if op.attrs.get("accumulate", False) else STORE
    launch_gemv(env.buf[op.reads[0]], op.weights["w"], out, epilogue=epilogue, round_y=True, env=env)
