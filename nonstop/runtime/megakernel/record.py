"""Record the Triton launches of the super-op launch functions without running them.

The megakernel runs the same kernel bodies as the ``superop`` backend. Rather than re-deriving every
launcher's pointer, stride and block choices, it calls each op's ``launch(op, env)`` once per step
shape under a ``LaunchRecorder``: every ``kernel[grid](...)`` is captured as a ``Launch`` (the
launcher ``@triton.jit`` function, the grid size, and its arguments bound to parameter names) and
nothing runs. Torch work a launch function does (a workspace's first zeroing) still happens.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from nonstop.runtime.launch_count import _grid_size, _patch_lock, _triton_launch_classes

LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "launch_pdl", "maxnreg", "enable_fp_fusion", "debug"}


@dataclass
class Launch:
    """One recorded ``kernel[grid](...)``: ``fn`` the Python function of the launcher, ``grid`` the
    number of programs, ``args`` {parameter: value} in the launcher's order, ``options`` the launch
    options (num_warps, ...)."""

    fn: object
    grid: int
    args: dict
    options: dict

    @property
    def name(self) -> str:
        return self.fn.__name__


def python_function(kernel):
    """The plain Python function behind a ``JITFunction`` / ``InterpretedFunction`` / autotuner."""
    fn = kernel
    while hasattr(fn, "fn"):
        fn = fn.fn
    return fn


class LaunchRecorder:
    """``with LaunchRecorder() as rec: launch(op, env)`` then ``rec.launches``."""

    def __init__(self):
        self.launches: list[Launch] = []
        self._restore: list = []

    def _wrap(self, cls):
        original = cls.run
        rec = self

        def run(fn_self, *args, grid, warmup, **kwargs):
            if warmup:
                return original(fn_self, *args, grid=grid, warmup=warmup, **kwargs)
            size = _grid_size(grid)
            if size is None:
                raise ValueError(f"{fn_self}: callable grids cannot be recorded for the megakernel")
            fn = python_function(fn_self)
            options = {k: kwargs.pop(k) for k in list(kwargs) if k in LAUNCH_OPTIONS}
            bound = inspect.signature(fn).bind(*args, **kwargs)
            if size:
                rec.launches.append(Launch(fn, size, dict(bound.arguments), options))
            return None

        cls.run = run
        self._restore.append((cls, original))

    def __enter__(self):
        _patch_lock.acquire()
        try:
            for cls in _triton_launch_classes():
                self._wrap(cls)
        except BaseException:
            self._unpatch()
            _patch_lock.release()
            raise
        return self

    def __exit__(self, *exc):
        self._unpatch()
        _patch_lock.release()

    def _unpatch(self):
        for cls, original in reversed(self._restore):
            cls.run = original
        self._restore.clear()


def record_ops(ops, kernels: dict, env) -> list[list[Launch]]:
    """The launches of every op in ``ops`` (one list per op, usually one launch each)."""
    out = []
    with LaunchRecorder() as rec:
        for op in ops:
            start = len(rec.launches)
            kernels[op.kind](op, env)
            out.append(rec.launches[start:])
    return out

