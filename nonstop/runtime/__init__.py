"""Executors that run a model's decode step: ``reference`` (op by op, the spec), ``superop`` (one
Triton launch per super-operator), ``megakernel`` (one persistent launch per step) and ``cpu`` (the step
compiled for CPUs; the default there)."""

from nonstop.runtime.executors import BACKENDS, make_executor, resolve_backend

__all__ = ["BACKENDS", "make_executor", "resolve_backend"]
