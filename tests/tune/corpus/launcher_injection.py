"""CHEAT: nonstop.kernels.launch.launcher compiles source text: a launcher "name" with a newline in it
runs arbitrary module-level code in the process (here: reading the environment).
kind: linear_residual
expect: static: not a host function a candidate may call"""

import triton
import triton.language as tl

from nonstop.kernels.dense import linear_residual as builtin
from nonstop.kernels.launch import launcher


@triton.jit
def _tile(tile, x_ptr):
    tl.load(x_ptr + tile)


def launch(op, env):
    launcher(_tile, name="k(x_ptr):\n    pass\nimport os\nSEEN = os.environ.get('HOME')\ndef k2")
    builtin(op, env)
