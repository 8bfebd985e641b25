"""Count the kernel launches of a block of code, on any machine.

Two sources of launches, both counted while a ``LaunchCounter`` is active:

* Triton: every ``kernel[grid](...)`` of any ``JITFunction`` (a GPU) or ``InterpretedFunction``
  (``TRITON_INTERPRET=1``), counted once per call of its ``run`` (autotuner / heuristics wrappers end
  in exactly one such call; warm-up compiles and empty grids are not launches);
* torch: every aten operator that runs on the counted device and does work there (a kernel, or a
  memset / memcpy node in a CUDA graph). Views, allocations and metadata operators launch nothing
  and are not counted. Operators that Triton's interpreter issues to move arguments are not counted.

Host synchronisations (``.item()``, ``int(t)``, ``.tolist()``, ``nonzero``, device-to-host copies) and
uploads of host data (``torch.tensor(list)``, ``from_numpy``) are recorded separately as
``host_syncs``, per op kind: code that does either cannot be captured in a CUDA graph.

A torch operator is counted as one launch; a few aten operators launch several kernels on a GPU
(sorting, ``unique``, ``nonzero``), so on a GPU the exact count comes from the profiler
(``bench/decode.py`` reports both).
"""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# aten operators that allocate or describe memory without running anything on the device
NO_LAUNCH = {
    "empty",
    "empty_strided",
    "empty_like",
    "new_empty",
    "new_empty_strided",
    "resize_",
    "set_",
    "detach",
    "detach_",
    "alias",
    "lift_fresh",
    "is_same_size",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "_local_scalar_dense",
    "is_nonzero",
}
# aten operators that wait for the device and bring a value to the host
HOST_SYNC = {
    "_local_scalar_dense",
    "nonzero",
    "is_nonzero",
    "unique",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "masked_select",
    "item",
}

# tensor methods that bring data to the host (on a CPU they dispatch nothing, on a GPU they sync; printing a
# tensor - str, repr, f-strings, "%s" - reads its values with every torch mode switched off), and factories
# that upload host data (a GPU copies it from pageable memory: not capturable in a graph)
HOST_METHODS = {
    torch.Tensor.tolist: "tolist",
    torch.Tensor.numpy: "numpy",
    torch.Tensor.cpu: "cpu",
    torch.Tensor.__repr__: "repr",
    torch.Tensor.__format__: "format",
}
HOST_UPLOADS = {torch.tensor: "tensor", torch.as_tensor: "as_tensor", torch.from_numpy: "from_numpy"}

_patch_lock = threading.Lock()
_patch_owner: int | None = None  # the thread holding _patch_lock


def _tensors(tree) -> list[torch.Tensor]:
    out = []
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    return out


def _grid_size(grid) -> int | None:
    """Programs in a launch grid, or None when the grid is a callable (resolved inside Triton)."""
    if callable(grid):
        return None
    if isinstance(grid, int):
        return grid
    n = 1
    for g in grid:
        n *= int(g)
    return n


class TritonRunPatch:
    """While active, ``run`` of every Triton launch class (``JITFunction``, ``InterpretedFunction``) is
    ``make_run(original_run)``; one patch at a time in the process (a lock), undone on exit."""

    def __init__(self, make_run):
        self.make_run = make_run
        self._restore: list = []

    def __enter__(self):
        global _patch_owner
        if _patch_owner == threading.get_ident():  # the lock is not reentrant: waiting would wait forever
            raise RuntimeError("a Triton launch patch (LaunchCounter) is already active in this thread: not nestable")
        _patch_lock.acquire()
        _patch_owner = threading.get_ident()
        try:
            for cls in _triton_launch_classes():
                original = cls.run
                cls.run = self.make_run(original)
                self._restore.append((cls, original))
        except BaseException:
            self._release()
            raise
        return self

    def __exit__(self, *exc):
        self._release()

    def _release(self):
        global _patch_owner
        self._unpatch()
        _patch_owner = None
        _patch_lock.release()

    def _unpatch(self):
        for cls, original in reversed(self._restore):
            cls.run = original
        self._restore.clear()


class LaunchCounter(TorchDispatchMode):
    """``with LaunchCounter(device) as c: ...`` then ``c.total``, ``c.triton``, ``c.torch``, ``c.syncs``.

    ``c.tag`` (set by the caller, e.g. the op kind being run) attributes launches and syncs:
    ``c.by_tag[tag]`` counts launches, ``c.syncs_by_tag[tag]`` host syncs.
    """

    def __init__(self, device: torch.device | str):
        super().__init__()
        self.device_type = torch.device(device).type
        self.triton: Counter = Counter()  # kernel name -> launches
        self.torch: Counter = Counter()  # aten op -> launches
        self.syncs: Counter = Counter()  # aten op -> host syncs
        self.by_tag: Counter = Counter()
        self.syncs_by_tag: Counter = Counter()
        self.pdl_launches = 0
        self.tag: str | None = None
        self._in_triton = 0
        self._in_host_method = 0
        self._triton_patch = TritonRunPatch(self._counting_run)
        self._host_watch = _HostMethodWatch(self)

    # ------------------------------------------------------------------ totals
    @property
    def total(self) -> int:
        return sum(self.triton.values()) + sum(self.torch.values())

    def summary(self) -> dict:
        return {
            "launches": self.total,
            "triton": sum(self.triton.values()),
            "torch": sum(self.torch.values()),
            "host_syncs": sum(self.syncs.values()),
            "pdl_launches": self.pdl_launches,
            "by_kind": dict(self.by_tag),
            "host_syncs_by_kind": dict(self.syncs_by_tag),
            "torch_ops": dict(self.torch),
            "triton_kernels": dict(self.triton),
        }

    # ------------------------------------------------------------------ torch operators
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._in_triton:
            return out
        name = func.overloadpacket.__name__
        if self._in_host_method:
            pass
        elif name in HOST_SYNC or (name in ("_to_copy", "copy_") and self._device_to_host(func, args, kwargs, out)):
            self.syncs[name] += 1
            self.syncs_by_tag[self.tag] += 1
        if name in NO_LAUNCH or func.is_view:
            return out
        if any(t.device.type == self.device_type for t in _tensors((args, kwargs, out))):
            self.torch[name] += 1
            self.by_tag[self.tag] += 1
        return out

    def _device_to_host(self, func, args, kwargs, out) -> bool:
        if self.device_type == "cpu":
            return False
        ins = [t.device.type for t in _tensors((args, kwargs))]
        outs = [t.device.type for t in _tensors(out)]
        return self.device_type in ins and "cpu" in outs

    # ------------------------------------------------------------------ Triton launches
    def _counting_run(self, original):
        """A Triton ``run`` that counts the launch, then launches."""
        counter = self

        def run(fn_self, *args, grid, warmup, **kwargs):
            if warmup:
                return original(fn_self, *args, grid=grid, warmup=warmup, **kwargs)
            size = _grid_size(grid)
            if size != 0:
                name = getattr(fn_self, "__name__", None) or getattr(
                    getattr(fn_self, "fn", None), "__name__", "triton_kernel"
                )
                counter.triton[name] += 1
                counter.by_tag[counter.tag] += 1
                if kwargs.get("launch_pdl"):
                    counter.pdl_launches += 1
            counter._in_triton += 1
            try:
                return original(fn_self, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                counter._in_triton -= 1

        return run

    def __enter__(self):
        self._triton_patch.__enter__()
        self._host_watch.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._host_watch.__exit__(*exc)
            self._triton_patch.__exit__(*exc)

    @contextmanager
    def tagged(self, tag: str):
        """Attribute what runs inside to ``tag``."""
        previous, self.tag = self.tag, tag
        try:
            yield
        finally:
            self.tag = previous


class _HostMethodWatch(TorchFunctionMode):
    """Records ``tolist`` / ``numpy`` / ``cpu`` calls and host-data factories as host syncs (a CPU
    dispatches nothing that would show them)."""

    def __init__(self, counter: LaunchCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        c = self.counter
        name = HOST_METHODS.get(func)
        if name is None and func in HOST_UPLOADS and args and not isinstance(args[0], torch.Tensor):
            name = HOST_UPLOADS[func]
        if name is None or c._in_triton:
            return func(*args, **(kwargs or {}))
        c.syncs[name] += 1
        c.syncs_by_tag[c.tag] += 1
        c._in_host_method += 1
        try:
            return func(*args, **(kwargs or {}))
        finally:
            c._in_host_method -= 1


def _triton_launch_classes() -> list:
    """The classes whose ``run`` is one Triton launch (none when Triton is not installed)."""
    classes = []
    try:
        from triton.runtime.jit import JITFunction

        classes.append(JITFunction)
    except ImportError:
        return classes
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:
        pass
    return classes
