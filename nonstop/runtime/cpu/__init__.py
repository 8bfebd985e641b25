"""The fast CPU path: the decode Program compiled once per step shape (``executor.CPUExecutor``),
with fp32, bf16 or int8 weights (C++ GEMV kernels) and a per-core default thread count."""

from nonstop.runtime.cpu.executor import CPUExecutor

__all__ = ["CPUExecutor"]
