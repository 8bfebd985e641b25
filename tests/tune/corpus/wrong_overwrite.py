"""WRONG: stores y instead of adding it to the residual stream.
kind: linear_residual
expect: dynamic: differ from the twin"""

from nonstop.kernels.gemv import STORE, launch_gemv


def launch(op, env):
    launch_gemv(
        env.buf[op.reads[0]],
        op.weights["w"],
        env.buf[op.writes[0]],
        bias=op.weights.get("b"),
        epilogue=STORE,
        round_y=True,
        env=env,
    )
