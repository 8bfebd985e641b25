"""Record the Triton launches of the super-op launch functions without running them.

The megakernel runs the same kernel bodies as the ``superop`` backend. Rather than re-deriving every
launcher's pointer, stride and block choices, it calls each op's ``launch(op, env)`` once per step
shape under a ``LaunchRecorder``: every ``kernel[grid](...)`` is captured as a ``Launch`` (the
launcher ``@triton.jit`` function, the grid size, and its arguments bound to parameter names) and
nothing runs. Torch work a launch function does (a workspace's first zeroing) still happens.

A stored winner of ``nonstop tune`` (``runtime/tuned.TunedKind`` in the table) is recorded like a built-in
launch function: one whose launches are all declared launchers (the built-in launchers with other block
sizes, warps or stages: what the ``search`` proposer writes) runs in the megakernel with its arguments;
one that launches kernels of its own (not tile functions the megakernel can call) is refused for its
shape (``TunedKind.refuse``: a warning and ``stats["tuned"][kind]["refused"]``) and the built-in launch
function is recorded instead.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from nonstop.kernels.launch import declaration, python_function
from nonstop.runtime.launch_count import TritonRunPatch, _grid_size

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
    weights: frozenset = frozenset()  # arguments that are the op's streamed weights (``weight_roles``)
    side: frozenset = frozenset()  # arguments that are side streams of them (MXFP4 scales)
    kernel: object = None  # the launched JITFunction (what an offline compile warms up)

    @property
    def name(self) -> str:
        return self.fn.__name__


class LaunchRecorder:
    """``with LaunchRecorder() as rec: launch(op, env)`` then ``rec.launches``."""

    def __init__(self):
        self.launches: list[Launch] = []
        self._patch = TritonRunPatch(self._recording_run)

    def _recording_run(self, original):
        """A Triton ``run`` that records the launch instead of launching (warm-up compiles still run)."""
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
                rec.launches.append(Launch(fn, size, dict(bound.arguments), options, kernel=fn_self))
            return None

        return run

    def __enter__(self):
        self._patch.__enter__()
        return self

    def __exit__(self, *exc):
        self._patch.__exit__(*exc)


def _storage(t) -> int:
    return t.untyped_storage()._cdata


def weight_roles(op) -> tuple[set[int], set[int]]:
    """(storages of ``op``'s streamed weights, of its side streams): weights of 2+ dimensions of at least a
    quarter of the op's largest weight tensor stream (GEMV matrices, expert weights, embeddings), those of
    1/32 .. 1/4 of it ride along (MXFP4 scales); vectors (norms, biases) and small tensors (conv taps) neither."""
    tensors = [t for t in op.weights.values() if isinstance(t, torch.Tensor) and t.dim() >= 2]
    largest = max((t.numel() * t.element_size() for t in tensors), default=0)
    streamed = {_storage(t) for t in tensors if 4 * t.numel() * t.element_size() >= largest}
    side = {_storage(t) for t in tensors if 32 * t.numel() * t.element_size() >= largest} - streamed
    return streamed, side


def record_ops(ops, kernels: dict, env) -> list[list[Launch]]:
    """The launches of every op in ``ops`` (one list per op, usually one launch each); each launch knows
    which of its arguments are the op's streamed weights and side streams (``weight_roles``)."""
    out = []
    with LaunchRecorder() as rec:
        for op in ops:
            start = len(rec.launches)
            kernels[op.kind](op, env)
            foreign = sorted({la.name for la in rec.launches[start:] if declaration(la.fn) is None})
            if foreign and hasattr(kernels[op.kind], "refuse"):  # a stored winner (runtime/tuned.py) with own kernels
                kernels[op.kind].refuse(
                    op,
                    env,
                    f"megakernel: the stored winner launches {', '.join(foreign)}, not "
                    "a tile function's launcher (nonstop.kernels.launch.launcher)",
                )
                del rec.launches[start:]
                kernels[op.kind](op, env)
            streamed, side = weight_roles(op)
            for launch in rec.launches[start:]:
                tensors = {n: _storage(v) for n, v in launch.args.items() if isinstance(v, torch.Tensor)}
                launch.weights = frozenset(n for n, st in tensors.items() if st in streamed)
                launch.side = frozenset(n for n, st in tensors.items() if st in side)
            out.append(rec.launches[start:])
    return out
