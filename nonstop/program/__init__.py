"""The decode Program: a model's step lowered into super-operator instances (see ``ir.py``)."""

from nonstop.program.ir import BufferSpec, Cost, Program, SuperOp
from nonstop.program.lower import lower

__all__ = ["BufferSpec", "Cost", "Program", "SuperOp", "lower"]
