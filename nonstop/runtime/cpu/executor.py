"""The ``cpu`` executor: the decode step as one compiled program on the CPU.

The model's Program (``program/lower.py``: weights packed per super-op) runs as one function
(``step.run_step``) that ``torch.compile`` (inductor, C++ kernels and a C++ wrapper calling them) turns
into fused loops around the matrix products, so a step costs a few hundred native calls and no Python
per kernel instead of the ~2,000 eager torch ops of the reference. With the C++ kernels built, one-token GQA
attention reads the paged cache in place in one kernel (``ops.gqa_attn_decode``, ``attention.cpp``).
Compiled once per step shape class (dynamic sizes: batch rows, context length, cache pool, page table)
and cached on disk (``compile_cache``); compiling is announced on stderr. Once compiled, a step is called directly under
torch.compile's own guards, with the Program's weights gathered once (``direct_call``: ~0.15-0.3 ms of
a ~1.4 ms k3-nano step, ``bench/cpu_direct_call.py``), and computes its cache rows from the page table
inside the graph.

Weights (``weights``): ``float32`` (as loaded), ``bfloat16`` (16-bit weights) or ``int8`` (8-bit
weight-only, ``weights.quant``), all three through the C++ GEMV kernels of ``kernels.py`` (weights in
row tiles, fp32 activations and accumulation; without the kernels, torch's products on the same
values), read with non-temporal prefetches when they outgrow the cache on AMD CPUs (``pack.streams_weights``:
on AVX2-only ones int8 only; never on Intel, where it halves the read rate).
``auto``: bfloat16 for a model loaded in bf16, else float32 (an fp16 model widens to fp32 exactly; bf16
would drop three bits of each weight's mantissa). The model's own parameters are set
to the values the packed weights represent, so a call that runs the reference model computes with the same
weights (fp32 row tiles are a second copy of those weights; a bf16 / fp16 model holds int8's s·Q rounded to its
dtype, ``pack.py``).

Calls the compiled step does not cover run the reference model, counted in ``stats["reference_steps"]``
by reason: cache-free scoring, prefill (more than one token per row), speculative verification
(``keep_states`` / ``row_exact``: every row as a one-token step) and ``forward_hidden`` (drafters).
"""

from __future__ import annotations

import os
import sys
import time
import types

import torch

from nonstop.cache.state import ModelCache, StepBatch
from nonstop.model.rows import is_row_exact
from nonstop.model.stack import CausalLM
from nonstop.program.lower import lower
from nonstop.program.preflight import PreflightError, available_memory, size_text
from nonstop.runtime.cpu.cache_view import cache_tensors, step_pages
from nonstop.runtime.cpu.compile_cache import (
    announced,
    compiled_anew_since,
    fx_graph_cache_counts,
    use_inductor_cache,
)
from nonstop.runtime.cpu.direct_call import CapturingInductor, DirectStep
from nonstop.runtime.cpu.kernels import load_kernels
from nonstop.runtime.cpu.ops import CPU_KERNEL_OPS, CPU_OPS
from nonstop.runtime.cpu.pack import pack_program, packed_bytes, packing_peak_bytes, streams_weights
from nonstop.runtime.cpu.step import run_step
from nonstop.runtime.interface import Executor
from nonstop.threads import configure_threads
from nonstop.weights.quant import DEFAULT_GROUP

WEIGHT_FORMATS = ("auto", "float32", "bfloat16", "int8")


def resolve_weights(weights: str, model_dtype: torch.dtype) -> str:
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"unknown CPU weight format {weights!r}; choose one of: {', '.join(WEIGHT_FORMATS)}")
    if weights != "auto":
        return weights
    return "bfloat16" if model_dtype == torch.bfloat16 else "float32"


def _own_copy(fn):
    """``fn`` with a code object of its own: torch.compile keeps its compiled graphs per code object,
    so each executor gets its own cache (no recompile limit shared with other models; the graphs hold this
    executor's weights as constants, unguarded: ``unguarded_fixed_arguments``, so no other executor may run
    them). Inductor keeps the compiled modules loaded for the life of the process: each ``cpu`` executor
    built leaves about 13-35 MB behind it (k3-nano, measured over 12 builds with one generate each)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__)


def _compiled_graphs() -> int:
    """Graphs torch.compile has produced in this process so far."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


FIXED_ARGUMENTS = ("program", "table")  # run_step's arguments that never change for one executor


def unguarded_fixed_arguments(guard_entries) -> list[bool]:
    """torch.compile's ``guard_filter_fn``: keep every guard except those on the executor's own Program and
    op table. An executor compiles its own copy of ``run_step`` (``_own_copy``) and always passes the same
    packed Program, never changed after ``pack_program``, and the same table; its ~1,000 guards on their
    attributes, dict keys and weight tensors would otherwise be checked before every step (~0.2 ms of a
    ~2 ms k3-nano step). Guards on the step's real inputs (ids, positions, cache tensors), on global state
    and on the dynamic shapes stay."""
    return [
        not any(e.name == a or e.name.startswith((a + ".", a + "[")) for a in FIXED_ARGUMENTS) for e in guard_entries
    ]


def compile_options() -> dict:
    """Inductor's options for the compiled step: the wrapper that calls the step's fused C++ loops and matrix
    products generated as C++ too (``cpp_wrapper``; off with ``NONSTOP_CPU_CPP_WRAPPER=0``: a Python wrapper
    costs a Python call and argument unpacking per kernel, ~150 a step, a quarter of a k3-nano step)."""
    return {"cpp_wrapper": os.environ.get("NONSTOP_CPU_CPP_WRAPPER", "1") != "0"}


def compile_step(step_fn):
    """(compiled step, its DirectStep or None): ``run_step``'s own copy compiled whole by inductor
    (``compile_options``), without guards on the fixed arguments (``unguarded_fixed_arguments``), called
    directly once compiled (``direct_call``; off with ``NONSTOP_CPU_DIRECT=0``)."""
    guards = {"guard_filter_fn": unguarded_fixed_arguments}
    if os.environ.get("NONSTOP_CPU_DIRECT", "1") == "0":
        return torch.compile(step_fn, fullgraph=True, options={**compile_options(), **guards}), None
    backend = CapturingInductor(compile_options())
    step = torch.compile(step_fn, backend=backend, fullgraph=True, options=guards)
    return step, DirectStep(step, backend, FIXED_ARGUMENTS)


def mark_dynamic_sizes(step_args) -> None:
    """Compile the step once for any batch size, context length, pool size, page table width and slot
    count: every dim of the step's inputs except the per-row feature dims (weights, reached through the
    program, stay static)."""
    ids, slots, start, pages, _, span, tensors = step_args
    for t in (ids, slots, start, pages, span):
        torch._dynamo.maybe_mark_dynamic(t, 0)
    torch._dynamo.maybe_mark_dynamic(pages, 1)
    for layer in tensors:
        for t in layer.values() if isinstance(layer, dict) else layer:
            torch._dynamo.maybe_mark_dynamic(t, 0)


class CPUExecutor(Executor):
    """``forward(input_ids [B, T], cache, batch, last_only)`` -> fp32 logits; see the module docstring.

    weights: ``auto`` | ``float32`` | ``bfloat16`` | ``int8``. compile: False runs the same step
    eagerly (tests, debugging); None: compile unless the environment says ``NONSTOP_CPU_COMPILE=0``.
    threads: torch threads (None: ``nonstop.threads.default_threads()``). int8_group: input columns per int8
    scale (``weights.quant``; per channel where it does not divide K; 0: always per channel).
    progress: announce compiles on stderr.
    """

    name = "cpu"

    def __init__(
        self,
        model: CausalLM,
        weights: str = "auto",
        compile: bool | None = None,
        threads: int | None = None,
        progress: bool = True,
        int8_group: int = DEFAULT_GROUP,
    ):
        device = model.embed_tokens.weight.device
        if device.type != "cpu":
            raise ValueError(
                f"backend 'cpu' runs on the CPU, but the model is on {device}; "
                "use backend 'superop' or 'reference' there"
            )
        self.model = model
        self.weights = resolve_weights(weights, model.embed_tokens.weight.dtype)
        self.program = lower(model)
        self.threads = configure_threads(threads, self.program.total_cost(rows=1).weight_bytes, announce=progress)
        self.progress = progress
        kernels_error = load_kernels(progress) or self._room_for_packing()
        stream = kernels_error is None and streams_weights(
            packed_bytes(self.program, self.weights), self.weights, int(torch.ops.nonstop_cpu.isa_level())
        )
        pack_program(self.program, self.weights, kernels=kernels_error is None, group=int8_group, stream=stream)
        self.table = CPU_KERNEL_OPS if kernels_error is None else CPU_OPS  # the super-ops' implementations
        if compile is None:
            compile = os.environ.get("NONSTOP_CPU_COMPILE", "1") != "0"
        self.compiled = compile
        if compile:
            use_inductor_cache()
            self._step, self._direct = compile_step(_own_copy(run_step))
        else:
            self._step, self._direct = run_step, None
        self._shapes: set = set()
        self.stats = {
            "weights": self.weights,
            "threads": self.threads,
            "kernels": kernels_error or "C++ GEMV kernels",
            "weight_loads": "streamed (non-temporal)" if stream else "cached",
            "compiled_steps": 0,
            "direct_steps": 0,  # compiled steps called without torch.compile's frame machinery (direct_call)
            "reference_steps": 0,
            "reference_reasons": {},
            "compile_seconds": {},
            "compiling_s": 0.0,  # all compiling so far: first compiles and recompiles, from the cache or not
            "compiled_anew_s": 0.0,  # the part of it that compiled a graph (not all loaded from the cache)
            "recompiles": 0,
        }

    def _room_for_packing(self) -> str | None:
        """None when packing the weights fits in free memory at its peak (``packing_peak_bytes``). Else fp32
        keeps the loaded fp32 tensors (returns why: no kernels then); bf16 / int8, or fp32 on a 16-bit model
        (whose weights widen only in a copy), refuse with a one-line PreflightError."""
        need, free = packing_peak_bytes(self.program, self.weights), available_memory(torch.device("cpu"))
        if need <= free:
            return None
        why = f"the {self.weights} row tiles take {size_text(need)} to pack beside the loaded weights"
        why += f"; {size_text(free)} free"
        if self.weights != "float32" or self.model.embed_tokens.weight.dtype != torch.float32:
            raise PreflightError(f"backend cpu: {why} (load the model in bfloat16, or use more memory)")
        if self.progress:
            print(f"nonstop cpu: {why}: fp32 products run in torch on the loaded weights", file=sys.stderr)
        return why

    # ------------------------------------------------------------------ routing
    def _fallback_reason(
        self, input_ids: torch.Tensor, cache: ModelCache | None, batch: StepBatch | None
    ) -> str | None:
        if cache is None or batch is None:
            return "scoring without a cache"
        if batch.keep_states:
            return "speculative verification (keep_states)"
        if is_row_exact():
            return "row_exact step"
        if input_ids.shape[1] != 1:
            return "prefill (T > 1)"
        return None

    def _reference(self, reason: str):
        self.stats["reference_steps"] += 1
        reasons = self.stats["reference_reasons"]
        reasons[reason] = reasons.get(reason, 0) + 1
        return self.model

    # ------------------------------------------------------------------ the compiled step
    def _shape_class(self, B: int, L: int) -> str:
        return f"batch {'1' if B == 1 else 'B>1'}, context {'1' if L == 1 else 'L>1'}"

    def run_compiled(self, input_ids: torch.Tensor, cache: ModelCache, batch: StepBatch) -> torch.Tensor:
        """One step through the compiled program; logits [B·T, V] fp32."""
        pages, page_size, span = step_pages(cache, batch)
        tensors = cache_tensors(cache)
        args = (self.program, self.table, input_ids, batch.slots, batch.start, pages, page_size, span, tensors)
        self.stats["compiled_steps"] += 1
        shape = self._shape_class(input_ids.shape[0], span.shape[0])
        if self.compiled and shape not in self._shapes:  # the marks matter to compiling only (tens of us a step)
            mark_dynamic_sizes(args[2:])
        if not self.compiled:
            return self._step(*args)[0]
        if shape in self._shapes:
            logits = self._direct(*args) if self._direct is not None else None
            if logits is not None:
                self.stats["direct_steps"] += 1
                return logits
            graphs, cache_counts = _compiled_graphs(), fx_graph_cache_counts()
            t0 = time.perf_counter()
            logits = self._step(*args)[0]
            if self._direct is not None:
                self._direct.learn(*args)
            if _compiled_graphs() > graphs:  # torch.compile specialised the step again (e.g. a new input kind)
                self.stats["recompiles"] += 1
                self._count_compiling(time.perf_counter() - t0, cache_counts)
                if self.progress:
                    print(
                        f"nonstop cpu: the decode step for {shape} was compiled again "
                        f"({time.perf_counter() - t0:.1f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
            return logits
        cache_counts = fx_graph_cache_counts()
        with announced(
            f"preparing the decode step for {shape} (compiled on first use, then loaded from the cache)",
            enabled=self.progress,
        ) as timing:
            logits = self._step(*args)[0]
            loaded = not compiled_anew_since(cache_counts)
            timing["note"] = (
                "loaded from the cache: traced, not compiled" if loaded else "compiled, cached for later runs"
            )
        if self._direct is not None:
            self._direct.learn(*args)
        self._shapes.add(shape)
        self.stats["compile_seconds"][shape] = round(timing["seconds"], 2)
        self._count_compiling(timing["seconds"], cache_counts)
        return logits

    def _count_compiling(self, seconds: float, cache_counts: tuple[int, int, int]) -> None:
        """Add ``seconds`` spent preparing a step to ``compiling_s``, and to ``compiled_anew_s`` when inductor
        compiled a graph since ``cache_counts`` (``fx_graph_cache_counts()`` before) rather than loading all
        of them from its on-disk cache."""
        self.stats["compiling_s"] += seconds
        if compiled_anew_since(cache_counts):
            self.stats["compiled_anew_s"] += seconds

    # ------------------------------------------------------------------ executor interface
    def forward(
        self, input_ids: torch.Tensor, cache: ModelCache | None, batch: StepBatch | None, last_only: bool = False
    ) -> torch.Tensor:
        reason = self._fallback_reason(input_ids, cache, batch)
        if reason is not None:
            return self._reference(reason)(input_ids, cache, batch, last_only=last_only)
        B, T = input_ids.shape
        logits = self.run_compiled(input_ids, cache, batch).view(B, T, -1)
        return logits[:, -1] if last_only else logits

    def forward_hidden(self, input_ids: torch.Tensor, cache: ModelCache, batch: StepBatch, taps: tuple[int, ...]):
        """(logits [B, T, V], {tap: residual stream entering layer tap [B, T, d]}) - the reference's."""
        return self._reference("hidden states (drafter)").forward_hidden(input_ids, cache, batch, taps)
