"""CHEAT: returns the twin's own result.
kind: linear_residual
expect: static: nonstop.program.reference"""

from nonstop.program.reference import linear_residual as launch  # noqa: F401
