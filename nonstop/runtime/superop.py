"""The ``superop`` executor: a decode step as one call per super-op of the model's Program.

With ``use_kernels`` every op is one Triton launch (``nonstop/kernels``); without, each op runs its
plain-torch twin (``program/reference.py``) - the same program, used to test the decomposition on
any machine. Steps of more than ``program.max_rows`` rows (long prefills) and cache-free scoring run
the reference model; decode and speculative verification (up to ``max_rows`` rows) run the program.

Per step shape (B sequences × T tokens) the executor owns a ``StaticStep``: the Program's activation
buffers, allocated once and reused by every step of that shape, and the step's own ``slots`` /
``start`` tensors. On CUDA (with kernels) the whole step of a shape is captured in one CUDA graph and
replayed: each step copies the input ids, slots and starts into the static tensors, grows the cache
pools to the page table, and replays - or, when the cache storage moved (a pool grew, the page table
widened, another cache), runs the step eagerly and captures it again (``cuda_graph.py``).

Launches are counted with a ``LaunchCounter`` (every Triton launch, helper launches included, and
every torch operator the launch functions run on the device): while a graph is captured (exactly
what each replay launches), or without graphs on the first eager steps of a shape until two counts
agree (so one-time work such as a workspace's first zeroing is left out). The counts are in
``stats``: ``launches_per_step`` (the latest shape), ``launches`` (per shape, with a breakdown by op
kind), ``host_syncs_per_step`` (must be 0 for a capturable step), ``pdl_launches_per_step``.
Every kernel launch uses programmatic dependent launch when ``env.pdl`` (``cuda_graph.pdl_support``;
``kernels/launch.py``: ``pdl_launch_args``, ``pdl_wait``).
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass

import torch

from nonstop.cache.state import ModelCache, StepBatch
from nonstop.model.rows import is_row_exact
from nonstop.model.stack import CausalLM
from nonstop.program.ir import Program
from nonstop.program.lower import lower
from nonstop.program.reference import REFERENCE, StepEnv
from nonstop.runtime.cuda_graph import (
    CapturedStep,
    fit_pools,
    graphs_wanted,
    module_containers,
    new_pool,
    pdl_support,
    storage_signature,
)
from nonstop.runtime.interface import Executor
from nonstop.runtime.launch_count import LaunchCounter
from nonstop.runtime.tuned import use_tuned


def kernel_table() -> dict:
    from nonstop.kernels import KERNELS

    return KERNELS


def missing_kernels(program: Program, table: dict) -> list[str]:
    """Op kinds of ``program`` that ``table`` has no launch function for (sorted)."""
    return sorted({op.kind for op in program.ops} - set(table))


def refused_ops(program: Program, table: dict) -> list[str]:
    """Why the built-in kernels in ``table`` cannot run some ops of ``program`` (``REFUSALS`` of
    ``nonstop.kernels``; sorted, each reason once). A kernel the caller supplied instead is not asked."""
    from nonstop.kernels import KERNELS, REFUSALS

    reasons = set()
    for op in program.ops:
        refusal = REFUSALS.get(op.kind)
        if refusal is not None and table.get(op.kind) is KERNELS.get(op.kind):
            reasons.add(refusal(op.attrs))
    return sorted(reasons - {None})


@dataclass
class ExecEnv(StepEnv):
    """A ``StepEnv`` plus what the executor offers a kernel launch.

    pdl: this step may use programmatic dependent launch (CUDA, sm_90+, not the interpreter): a launch
    that opts in passes ``**env.launch_kwargs`` and waits with ``tl.extra.cuda.gdc_wait()`` before
    touching its predecessors' outputs (see ``cuda_graph.py``).
    """

    pdl: bool = False

    @property
    def launch_kwargs(self) -> dict:
        return {"launch_pdl": True} if self.pdl else {}


class StaticStep:
    """What the steps of one shape reuse: activation buffers ``buf`` (``program.allocate``), ``slots`` [B]
    / ``start`` [B] (long) with their ``batch``, the captured graph, the launch count. A shape is (B, T,
    keep_states, row_exact): speculative verification keeps KDA states and computes row by row."""

    def __init__(self, program: Program, key: tuple, device, pool, emulate: bool):
        B, T, keep_states, _ = key
        with torch.inference_mode(False):  # normal tensors: usable in and out of inference mode
            self.buf = program.allocate(B * T, device)
            self.slots = torch.zeros(B, dtype=torch.long, device=device)
            self.start = torch.zeros(B, dtype=torch.long, device=device)
        self.B, self.T = B, T
        self.name = f"{B}x{T}" + ("+states" if keep_states else "") + ("+row_exact" if key[3] else "")
        self.batch = StepBatch(self.slots, self.start, T, keep_states)
        self.graph = CapturedStep(pool, emulate)
        self.launches: dict | None = None
        self.counts_left = 3  # eager steps that may still be counted (until two counts agree)
        self.graph_off: str | None = None  # why this shape runs without a graph
        self.sample_buf: dict | None = None  # the device sampler's per-row buffers (``sample_tokens``)


class SuperOpExecutor(Executor):
    """``forward(input_ids [B, T], cache, batch, last_only)`` -> fp32 logits, through the Program.

    use_kernels: Triton kernels (else the twins). graphs: True | False | "auto" (CUDA with kernels) |
    "emulate" (capture/replay logic without CUDA: replay re-runs the captured launches; for tests).
    pdl: True | False | "auto" (where supported). kernels: a kernel table to use instead of
    ``nonstop.kernels.KERNELS`` (tests). copy_logits: return logits the caller owns (else a view of a
    static buffer that the next step overwrites). program: ``lower(model)`` when already lowered
    (lowering again would re-pack the weights).
    """

    name = "superop"

    def __init__(
        self,
        model: CausalLM,
        use_kernels: bool = True,
        graphs="auto",
        pdl="auto",
        kernels: dict | None = None,
        copy_logits: bool = True,
        program: Program | None = None,
    ):
        self.model = model
        self.program = program if program is not None else lower(model)
        self.device = model.embed_tokens.weight.device
        self.use_kernels = use_kernels
        if use_kernels:
            table = kernel_table() if kernels is None else kernels
            missing = missing_kernels(self.program, table)
            if missing:
                raise ValueError(f"backend 'superop' has no Triton kernel yet for: {', '.join(missing)}")
            refused = refused_ops(self.program, table)
            if refused:
                raise ValueError(
                    f"backend 'superop' cannot run this model: {'; '.join(refused)}; backends 'reference' and 'cpu' can"
                )
            self.impl = table
        else:
            self.impl = REFERENCE
        self.emulate = graphs == "emulate"
        if self.emulate:
            self.graphs, graphs_reason = True, "emulated (replay re-runs the launches)"
        else:
            self.graphs, graphs_reason = graphs_wanted(self.device, use_kernels, graphs)
        pdl_ok, pdl_reason = pdl_support(self.device)
        self.pdl = bool(use_kernels and pdl_ok and pdl in (True, "auto"))
        if pdl is False or not use_kernels:
            pdl_reason = "off" if pdl is False else "twins"
        self.copy_logits = copy_logits
        self._pool = new_pool(self.device) if self.graphs and not self.emulate else None
        self._steps: dict[tuple, StaticStep] = {}
        kernel_modules = (
            [m for name, m in sorted(sys.modules.items()) if name.startswith("nonstop.kernels.") and m is not None]
            if use_kernels
            else []
        )
        self._kept = module_containers(kernel_modules)  # kernel workspaces: part of the storage signature
        self.stats = {
            "launches_per_step": None,
            "host_syncs_per_step": None,
            "pdl_launches_per_step": None,
            "launches": {},
            "program_steps": 0,
            "reference_steps": 0,
            "eager_steps": 0,
            "graph_captures": 0,
            "graph_replays": 0,
            "graphs": graphs_reason,
            "pdl": ("on: " if self.pdl else "off: ") + pdl_reason,
        }
        if use_kernels:  # stored winners of `nonstop tune` for this device (runtime/tuned.py); the built-ins otherwise
            self.impl = use_tuned(self.impl, self.program, self.device, self.stats)

    @property
    def max_rows(self) -> int:
        """Rows a step runs through the program; larger steps run the reference model."""
        return self.program.max_rows

    # ------------------------------------------------------------------ static state
    def static_step(self, B: int, T: int, keep_states: bool = False) -> StaticStep:
        key = (B, T, bool(keep_states), is_row_exact())
        step = self._steps.get(key)
        if step is None:
            step = self._steps[key] = StaticStep(self.program, key, self.device, self._pool, self.emulate)
        return step

    def storage_signature(self, cache: ModelCache) -> tuple:
        return storage_signature(cache, [getattr(m, name) for m, name in self._kept])

    # ------------------------------------------------------------------ running the ops
    def _launch_all(self, env: ExecEnv) -> None:
        for op in self.program.ops:
            self.impl[op.kind](op, env)

    def _launch_counted(self, env: ExecEnv, step: StaticStep) -> dict:
        counter = LaunchCounter(self.device)
        with counter:
            for op in self.program.ops:
                with counter.tagged(op.kind):
                    self.impl[op.kind](op, env)
        return counter.summary()

    def _record(self, step: StaticStep, launches: dict) -> None:
        step.launches = launches
        self.stats["launches"][step.name] = launches
        self._publish(step)

    def _run_eagerly(self, env: ExecEnv, step: StaticStep, count: bool = True) -> None:
        """Run the ops now, counting the launches while the shape's count is not settled."""
        self.stats["eager_steps"] += 1
        if not count or step.counts_left == 0:
            self._launch_all(env)
            self._publish(step)
            return
        launches = self._launch_counted(env, step)
        step.counts_left = (
            0
            if step.launches is not None and step.launches["launches"] == launches["launches"]
            else step.counts_left - 1
        )
        self._record(step, launches)

    def _publish(self, step: StaticStep) -> None:
        if step.launches is not None:
            self.stats["launches_per_step"] = step.launches["launches"]
            self.stats["host_syncs_per_step"] = step.launches["host_syncs"]
            self.stats["pdl_launches_per_step"] = step.launches["pdl_launches"]

    def _replay_or_capture(self, cache: ModelCache, step: StaticStep) -> None:
        """Replay the shape's graph if the cache storage is the one it was captured with; else run the
        step eagerly (the real step: compiles kernels, counts launches) and capture it for next time."""
        fit_pools(cache)
        if step.graph.ready and step.graph.signature == self.storage_signature(cache):
            step.graph.replay()
            self.stats["graph_replays"] += 1
            self._publish(step)
            return
        env = ExecEnv(step.buf, cache, step.batch, pdl=self.pdl)
        self._run_eagerly(env, step, count=self.emulate)  # a real CUDA capture counts below instead
        counted: dict = {}
        record = (
            (lambda: self._launch_all(env))
            if self.emulate
            else (lambda: counted.update(self._launch_counted(env, step)))
        )
        try:  # the eager step may have grown storage (a workspace, KDA histories): sign what is captured
            step.graph.capture(record, self.storage_signature(cache))
            self.stats["graph_captures"] += 1
            if counted:
                self._record(step, counted)
        except Exception as exc:  # a launch that is not capturable: run this shape eagerly from now on
            step.graph.release()
            reason = f"capture failed: {type(exc).__name__}: {exc}"
            if self.pdl:  # retry without PDL first (an older driver may not capture PDL launches)
                self.pdl = False
                self.stats["pdl"] = f"off: {reason}"
            else:
                step.graph_off = reason
                self.stats["graphs"] = f"off for {step.name}: {reason}"
            warnings.warn(f"superop: CUDA graph {reason}", RuntimeWarning, stacklevel=3)

    def run_program(self, input_ids: torch.Tensor, cache: ModelCache, batch: StepBatch) -> torch.Tensor:
        """One step through the program; returns the static logits buffer viewed as [B, T, V] (fp32)."""
        B, T = input_ids.shape
        step = self.static_step(B, T, batch.keep_states)
        step.buf["ids"].copy_(input_ids.reshape(-1))
        if self.graphs and step.graph_off is None:
            step.slots.copy_(batch.slots)
            step.start.copy_(batch.start)
            self._replay_or_capture(cache, step)
        else:
            self._run_eagerly(ExecEnv(step.buf, cache, batch, pdl=self.pdl), step)
        return step.buf["logits"].view(B, T, -1)

    @property
    def samples_on_device(self) -> bool:
        """Can ``sample_tokens`` run (the Triton sampler: a kernel backend, not the twins)?"""
        return self.use_kernels

    def check_sample_rows(self, B: int) -> None:
        """A ValueError when ``sample_tokens`` is given more sequences than the program's ``max_rows`` (the
        kernels' row limit; the engine splits larger decode steps into calls of at most that many)."""
        if B > self.max_rows:
            raise ValueError(f"sample_tokens: at most max_rows = {self.max_rows} sequences a call, got {B}")

    def sample_tokens(
        self, input_ids: torch.Tensor, cache: ModelCache, slots: list[int], n: int, rows: list
    ) -> torch.Tensor:
        """``n`` decode steps of ``slots`` from their last tokens ``input_ids`` [B, 1], each token sampled on
        the device after the step (``kernels/sample.py``) with ``rows`` (``runtime.device_sampling.SampleRow``
        per sequence; the noise counter is the token's position) and fed to the next step without a host
        round trip. Advances the cache by n; returns the tokens [B, n] (host int64); a ValueError for more
        than ``max_rows`` sequences. ``stats``: ``sampling_calls`` counts the calls, ``device_sampled_steps``
        their steps."""
        from nonstop.kernels import KERNELS
        from nonstop.kernels.sample import sample_op
        from nonstop.program.reference import StepEnv
        from nonstop.runtime.device_sampling import fill_sample_rows

        B = len(slots)
        if not self.use_kernels:
            raise ValueError("sample_tokens needs the Triton kernels (use_kernels=True)")
        if n < 1 or len(rows) != B or tuple(input_ids.shape) != (B, 1):
            raise ValueError(f"sample_tokens: n >= 1, input_ids [{B}, 1] and {B} sampling rows")
        self.check_sample_rows(B)
        step = self.static_step(B, 1)
        op, specs = sample_op(self.model.cfg.vocab_size)
        if step.sample_buf is None:  # the sampler's per-row buffers, next to the step's
            with torch.inference_mode(False):
                step.sample_buf = {
                    name: torch.zeros(B, dtype=getattr(torch, spec.dtype), device=self.device)
                    for name, spec in specs.items()
                    if name != "logits"
                }
        buf = step.sample_buf
        tokens, ids = [], input_ids
        for _ in range(n):
            batch = cache.batch(slots, 1)
            fill_sample_rows(buf, rows, batch.start + 1)
            logits = self.run_program(ids, cache, batch)
            self.stats["program_steps"] += 1
            KERNELS["sample"](op, StepEnv({**buf, "logits": logits.view(B, -1)}, cache, batch))
            cache.advance(batch)
            tokens.append(buf["next_ids"].clone())
            ids = buf["next_ids"].view(B, 1)
        self.stats["sampling_calls"] = self.stats.get("sampling_calls", 0) + 1
        self.stats["device_sampled_steps"] = self.stats.get("device_sampled_steps", 0) + n
        return torch.stack(tokens, 1).cpu()

    def forward(
        self, input_ids: torch.Tensor, cache: ModelCache | None, batch: StepBatch | None, last_only: bool = False
    ) -> torch.Tensor:
        if cache is None or input_ids.numel() > self.max_rows:
            self.stats["reference_steps"] += 1
            return self.model(input_ids, cache, batch, last_only=last_only)
        self.stats["program_steps"] += 1
        logits = self.run_program(input_ids, cache, batch)
        if last_only:
            logits = logits[:, -1]
        return logits.clone() if self.copy_logits else logits

    def forward_hidden(self, input_ids: torch.Tensor, cache: ModelCache, batch: StepBatch, taps: tuple[int, ...]):
        """``forward`` (all rows) plus the residual stream at ``taps``, {tap: [B, T, d]}, for a
        drafter. Through the program only the streams a step keeps to its end exist
        (``program/taps.py``: AttnRes block boundaries and the last layer's)."""
        from nonstop.program.taps import read_taps

        if input_ids.numel() > self.max_rows:
            self.stats["reference_steps"] += 1
            return self.model.forward_hidden(input_ids, cache, batch, taps)
        self.stats["program_steps"] += 1
        B, T = input_ids.shape
        logits = self.run_program(input_ids, cache, batch)
        buf = self.static_step(B, T, batch.keep_states).buf
        return logits.clone(), read_taps(self.model.cfg, buf, tuple(taps), B, T)
