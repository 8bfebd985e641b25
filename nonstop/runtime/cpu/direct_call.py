"""Call the compiled decode step without torch.compile's per-call frame machinery, under its own guards.

A compiled k3-nano step is ~1.4 ms, and torch.compile spends ~0.15-0.3 ms of each call around it
(``bench/cpu_direct_call.py``): the frame hook, then the bytecode that gathers the graph's ~190 inputs
(every weight tensor of the Program, through attribute and dict lookups) before calling the compiled
graph. The weights never change for one executor, so ``DirectStep`` gathers them once and, per call,
only the ~20-60 inputs that come from the step's arguments (ids, page table, span, cache tensors, their
dynamic sizes). With inductor's C++ wrapper a dynamic size (a Python int: one per cache pool, two a layer on
a Llama) is handed to the graph as a 0-d int64 tensor kept per value, since the wrapper would otherwise make
a fresh one per int per call (``torch.tensor``, ~4 us each: ~0.1 ms a step on a 12-layer Llama).

It keeps torch.compile's semantics: a call goes direct only when the first of the code's cache entries
whose guards (torch.compile's own guard manager, ~15 us) accept the arguments is an entry this object has
the graph for - exactly the entry torch.compile would run. Anything else (no entry accepts: a recompile;
an entry compiled before this object saw it; sources it cannot evaluate) goes through torch.compile.

``CapturingInductor`` is the backend that makes this possible: inductor with the executor's options, which
also records each graph it compiles with the sources of its inputs (``L['program'].ops[3].weights['w']``,
``L['span'].size()[0]``: Python expressions over the frame's locals ``L``).
"""

from __future__ import annotations

import dataclasses
import inspect

import torch


@dataclasses.dataclass
class Captured:
    """One compiled graph: fn(*inputs) -> its outputs; sources[i] names inputs[i] over the locals ``L``."""

    fn: object
    sources: list[str]
    outputs: int


class CapturingInductor:
    """torch.compile backend: inductor (``options`` as for ``torch.compile(options=...)``) recording each
    compiled graph in ``self.captured`` (oldest first)."""

    def __init__(self, options: dict):
        self.inner = torch._TorchCompileInductorWrapper(None, options, None)
        self.cpp_wrapper = bool(options.get("cpp_wrapper"))  # the graph takes its ints as 0-d tensors
        self.captured: list[Captured] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        sources = []
        for node in gm.graph.find_nodes(op="placeholder"):
            grapharg = node.meta.get("grapharg")
            source = getattr(grapharg, "source", None)
            sources.append(source.name if source is not None else None)
        output = gm.graph.find_nodes(op="output")[0].args[0]
        fn = self.inner(gm, example_inputs)
        self.captured.append(Captured(fn, sources, len(output) if isinstance(output, (tuple, list)) else -1))
        return fn


class DirectStep:
    """Direct calls of ``step`` (a function compiled with ``backend``) whose arguments named ``fixed`` never
    change. ``__call__(*args)`` -> the step's first output, or None when the call must go through
    torch.compile (then call ``step`` and afterwards ``learn(*args)``)."""

    def __init__(self, step, backend: CapturingInductor, fixed: tuple[str, ...]):
        self.code = step._torchdynamo_orig_callable.__code__
        parameters = inspect.signature(step._torchdynamo_orig_callable).parameters
        self.names = list(parameters)
        self.defaults = {n: p.default for n, p in parameters.items() if p.default is not inspect.Parameter.empty}
        self.backend = backend
        self.fixed = fixed
        self.known = 0  # backend.captured[:known] have been matched to cache entries (or given up)
        self.calls: dict[int, tuple] = {}  # id(guard manager) -> (guard manager, fn, template, dynamic, getter)
        self.sizes: dict[int, torch.Tensor] | None = {} if backend.cpp_wrapper else None  # size -> its 0-d tensor

    def _locals(self, args) -> dict:
        frame = dict(self.defaults)
        frame.update(zip(self.names, args))
        return frame

    def _entry(self, frame: dict):
        """The guard manager of the first cache entry that accepts ``frame`` (torch.compile's choice), or None."""
        for entry in torch._dynamo.eval_frame._debug_get_cache_entry_list(self.code):
            if entry.guard_manager.check(frame):
                return entry.guard_manager
        return None

    def __call__(self, *args):
        frame = self._locals(args)
        manager = self._entry(frame)
        call = self.calls.get(id(manager)) if manager is not None else None
        if call is None or call[0] is not manager:
            return None
        _, fn, template, dynamic, getter = call
        inputs = list(template)
        if self.sizes is None:  # a Python wrapper uses its ints as they are
            for i, value in zip(dynamic, getter(frame)):
                inputs[i] = value
        else:
            for i, value in zip(dynamic, getter(frame)):
                inputs[i] = self._size(value) if type(value) is int else value
        return fn(*inputs)[0]

    def _size(self, value: int) -> torch.Tensor:
        """The 0-d tensor inductor's wrapper would make of a dynamic size (never written by the graph)."""
        t = self.sizes.get(value)
        if t is None:
            if len(self.sizes) > 4096:  # sizes seen over a long run (pool rows, context lengths): bounded
                self.sizes.clear()
            t = self.sizes[value] = torch.tensor(value, dtype=torch.int64)
        return t

    def learn(self, *args) -> None:
        """After torch.compile ran ``args``: if it compiled a graph for them, remember that graph for the
        cache entry that now accepts them."""
        new = self.backend.captured[self.known :]
        self.known = len(self.backend.captured)
        if len(new) != 1 or new[0].outputs != 1 or None in new[0].sources:
            return  # nothing new, more than one graph (a graph break), outputs besides the first, a sourceless input
        frame = self._locals(args)
        manager = self._entry(frame)
        if manager is None or id(manager) in self.calls:
            return
        captured = new[0]
        roots = tuple(f"L[{n!r}]" for n in self.fixed)
        dynamic = [i for i, s in enumerate(captured.sources) if not s.startswith(roots)]
        is_dynamic = set(dynamic)
        try:
            values = eval("lambda L: [" + ", ".join(captured.sources) + "]", {})(frame)  # noqa: S307 - dynamo's own source names
            getter = eval("lambda L: (" + "".join(captured.sources[i] + ", " for i in dynamic) + ")", {})  # noqa: S307
        except Exception:  # a source that is not a plain expression over L: stay with torch.compile
            return
        template = [None if i in is_dynamic else v for i, v in enumerate(values)]
        if self.sizes is not None:
            template = [self._size(v) if type(v) is int else v for v in template]
        self.calls[id(manager)] = (manager, captured.fn, template, dynamic, getter)
