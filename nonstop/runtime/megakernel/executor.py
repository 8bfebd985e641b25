"""The ``megakernel`` executor: a decode step as ONE launch of a persistent Triton kernel.

Same interface and static-step machinery as ``SuperOpExecutor`` (it subclasses it): per step shape
(B sequences × T tokens) static activation buffers, slots and starts; long prefills (more than
``program.max_rows`` rows) and cache-free scoring run the reference model. What differs is how a step
runs: instead of one launch per op, ``StepKernel`` (``kernel.py``) holds the whole step as tasks of one
persistent kernel, built once per shape (schedule validated before its first launch) and refreshed
when the cache storage moves. The step also samples: a ``sample`` op after the LM head writes
``next_ids`` [R] on the device (greedy unless ``sampling`` buffers say otherwise), and the embedding of
the step's ``ids`` is the kernel's first task; a final ``advance`` op (``advance.py``) copies
``next_ids`` into ``ids`` and moves ``start`` on by T, so back-to-back decode steps need only the
launch on the host (``decode_next``; the host still reserves cache pages).

On CUDA the launch is captured in a CUDA graph per shape by the base class (a replay is one kernel);
``stats["launches_per_step"]`` counts the launches of a step (1) with the ``LaunchCounter``, and
``stats["schedule"]`` summarises each shape's schedule.
"""

from __future__ import annotations

import copy

import torch

from nonstop.cache.state import ModelCache, StepBatch
from nonstop.model.stack import CausalLM
from nonstop.program.ir import Program
from nonstop.runtime.cuda_graph import fit_pools
from nonstop.runtime.launch_count import LaunchCounter
from nonstop.runtime.megakernel import advance
from nonstop.runtime.megakernel.kernel import StepKernel
from nonstop.runtime.megakernel.verify.stats import schedule_stats
from nonstop.runtime.superop import ExecEnv, StaticStep, SuperOpExecutor


def megakernel_program(program: Program, vocab_size: int) -> tuple[Program, list]:
    """(``program`` plus the buffers of device sampling and ``advance``, the ops a step appends after the LM
    head: ``sample`` then ``advance``)."""
    from nonstop.kernels.sample import sample_op

    program = copy.copy(program)
    program.buffers = dict(program.buffers)
    sample, specs = sample_op(vocab_size)
    program.buffers.update(specs)
    program.buffers.update(advance.buffer_specs())
    return program, [sample, advance.advance_op()]


class MegakernelExecutor(SuperOpExecutor):
    """``forward(input_ids [B, T], cache, batch, last_only)`` -> fp32 logits, one kernel launch a step.

    graphs: as ``SuperOpExecutor`` ("auto": a CUDA graph of the one launch on CUDA). grid: programs of
    the persistent kernel (default: one per SM; 2 under the interpreter)."""

    name = "megakernel"

    def __init__(
        self,
        model: CausalLM,
        graphs="auto",
        copy_logits: bool = True,
        program: Program | None = None,
        grid: int | None = None,
        kernels: dict | None = None,
    ):
        try:
            super().__init__(
                model,
                use_kernels=True,
                graphs=graphs,
                pdl=False,
                kernels=kernels,
                copy_logits=copy_logits,
                program=program,
            )
        except ValueError as exc:  # a kind without a kernel: name this backend
            raise ValueError(str(exc).replace("backend 'superop'", "backend 'megakernel'")) from None
        self.program, self.extra_ops = megakernel_program(self.program, model.cfg.vocab_size)
        self.impl = dict(self.impl, advance=advance.launch)
        self.grid = grid
        self._kernels: dict[int, StepKernel] = {}  # id(step) -> its megakernel
        # id(step) -> (id(cache), cache.touches when the step's launch was made): what a continuation checks
        self._launched_at: dict[int, tuple[int, list[int]]] = {}
        self._steps_by_buf: dict[int, StaticStep] = {}
        self.stats["schedule"] = {}

    # ------------------------------------------------------------------ the step's kernel
    def static_step(self, B: int, T: int, keep_states: bool = False) -> StaticStep:
        step = super().static_step(B, T, keep_states)
        if id(step.buf) not in self._steps_by_buf:
            self._steps_by_buf[id(step.buf)] = step
            step.buf["sample_temperature"].zero_()  # greedy by default
            step.buf["sample_top_k"].zero_()
            step.buf["sample_top_p"].fill_(1.0)
            step.buf["sample_seed"].zero_()
            step.buf["sample_offset"].zero_()
        return step

    def step_kernel(self, env: ExecEnv) -> StepKernel:
        """The megakernel of env's shape, built (and validated) on first use, its addresses refreshed
        when the cache storage moved since it was recorded."""
        step = self._steps_by_buf[id(env.buf)]
        mk = self._kernels.get(id(step))
        signature = self.storage_signature(env.cache)
        if mk is not None and mk.signature != signature and not mk.refresh(env):
            mk = None  # the launches tile differently now: a new schedule (validated again)
        if mk is None:
            mk = self._kernels[id(step)] = StepKernel(
                self.program, [*self.program.ops, *self.extra_ops], self.impl, env, self.device, self.grid
            )
            self.stats["schedule"][step.name] = schedule_stats(mk.schedule) | {
                "task_classes": len(mk.plan.classes),
                "grid": mk.grid,
            }
        mk.signature = self.storage_signature(env.cache)  # recording may have grown a workspace
        return mk

    def _mark_histories(self, env: ExecEnv) -> None:
        """Speculative verification (``keep_states``): the KDA launchers mark the histories they fill
        (``KDAState.history_for`` sets ``history_rows[:, slots] = T``) when they are called - once, at
        recording. Every launch of such a step repeats that bookkeeping (one indexed store per KDA
        layer; plain decode steps have none)."""
        if env.batch.keep_states:
            for layer in env.cache.layers:
                rows = getattr(layer, "history_rows", None)
                if rows is not None:
                    rows[:, env.batch.slots] = env.T

    def _launch_all(self, env: ExecEnv) -> None:
        mk = self.step_kernel(env)
        self._mark_histories(env)
        mk.launch()

    def _launch_counted(self, env: ExecEnv, step: StaticStep) -> dict:
        mk = self.step_kernel(env)  # recording happens outside the count (it launches nothing)
        counter = LaunchCounter(self.device)
        with counter, counter.tagged("megakernel"):
            self._mark_histories(env)
            mk.launch()
        return counter.summary()

    # ------------------------------------------------------------------ steps
    def run_program(self, input_ids: torch.Tensor, cache: ModelCache, batch: StepBatch) -> torch.Tensor:
        """One step; the kernel reads only the shape's static tensors (ids, slots, starts), so its
        recorded addresses stay valid from step to step."""
        B, T = input_ids.shape
        step = self.static_step(B, T, batch.keep_states)
        step.buf["ids"].copy_(input_ids.reshape(-1))
        step.slots.copy_(batch.slots)
        step.start.copy_(batch.start)
        self._run_step(cache, step)
        self._note_launch(step, cache)
        return step.buf["logits"].view(B, T, -1)

    def _run_step(self, cache: ModelCache, step: StaticStep) -> None:
        """Launch the shape's kernel: replayed from (or captured into) its CUDA graph, or eagerly."""
        if self.graphs and step.graph_off is None:
            self._replay_or_capture(cache, step)
        else:
            fit_pools(cache)
            self._run_eagerly(ExecEnv(step.buf, cache, step.batch), step)

    def decode_next(self, cache: ModelCache, batch: StepBatch) -> torch.Tensor:
        """A decode step (T = 1) of the same sequences as the previous step of this shape, from the
        device: the previous launch left the sampled tokens in ``ids`` and the advanced positions in
        ``start``, so the host only reserves pages (``batch``, made by ``cache.batch``) and launches.
        Returns the step's sampled tokens [B, 1] (device; greedy unless the ``sample_*`` buffers say
        otherwise). The caller keeps ``cache.advance(batch)`` as usual."""
        B = batch.slots.shape[0]
        step = self.static_step(B, 1, batch.keep_states)
        self._require_launched(step, batch.slots, cache, made=1)
        self.stats["program_steps"] += 1
        self._run_step(cache, step)
        self._note_launch(step, cache)
        return step.buf["next_ids"].view(B, 1)

    def decode_steps(self, cache: ModelCache, slots: list[int], n: int) -> torch.Tensor:
        """``n`` greedy (device-sampled) decode steps of ``slots`` in ONE launch, continuing from the
        previous step of shape (len(slots), 1) as ``decode_next`` does. The pages of all n tokens are
        reserved first; the cache is advanced by n. Returns the sampled tokens [B, n] (host).
        The persistent schedule orders step e+1's tasks after what they need of step e."""
        if not 1 <= n <= advance.LOG:
            raise ValueError(f"decode_steps: 1..{advance.LOG} steps per launch")
        step = self.static_step(len(slots), 1)
        self._require_launched(step, torch.as_tensor(slots, dtype=torch.long, device=step.slots.device), cache)
        batch = cache.batch(slots, n)  # page reservation for positions start .. start + n - 1
        fit_pools(cache)
        env = ExecEnv(step.buf, cache, step.batch)
        mk = self.step_kernel(env)
        counter = LaunchCounter(self.device)
        with counter:
            mk.launch(num_steps=n)
        self._note_launch(step, cache)
        self.stats["program_steps"] += n
        self.stats["launches_per_multi_step"] = counter.total
        cache.advance(batch)
        first = batch.start.to("cpu") + 1  # position of the first sampled token
        cols = (first[:, None] + torch.arange(n)[None, :]) % advance.LOG
        return step.buf["token_log"].to("cpu").gather(1, cols)

    def sample_tokens(
        self, input_ids: torch.Tensor, cache: ModelCache, slots: list[int], n: int, rows: list
    ) -> torch.Tensor:
        """``n`` decode steps of ``slots`` from their last tokens ``input_ids`` [B, 1] in ONE launch, each
        token sampled on the device with ``rows`` (``runtime.device_sampling.SampleRow``, one per sequence:
        the request's temperature, top-k, top-p and seed; the noise counter is the token's position, so
        n steps a launch give the tokens of n launches of one step). Reserves the pages of all n tokens
        and advances the cache by n. Returns the tokens [B, n] (host int64); a ValueError for more than
        ``max_rows`` sequences. n = 1 replays the shape's CUDA graph where there is one."""
        from nonstop.runtime.device_sampling import fill_sample_rows

        B = len(slots)
        if not 1 <= n <= advance.LOG:
            raise ValueError(f"sample_tokens: 1..{advance.LOG} steps per launch, got {n}")
        if len(rows) != B or tuple(input_ids.shape) != (B, 1):
            raise ValueError(f"sample_tokens: {B} sequences need input_ids [{B}, 1] and {B} sampling rows")
        self.check_sample_rows(B)
        step = self.static_step(B, 1)
        batch = cache.batch(slots, n)  # page reservation for positions start .. start + n - 1
        step.buf["ids"].copy_(input_ids.reshape(-1))
        step.slots.copy_(batch.slots)
        step.start.copy_(batch.start)
        fill_sample_rows(step.buf, rows, batch.start + 1)  # each row samples the token at start + 1
        if n == 1:
            self._run_step(cache, step)
        else:
            fit_pools(cache)
            self.step_kernel(ExecEnv(step.buf, cache, step.batch)).launch(num_steps=n)
        self._note_launch(step, cache)
        self.stats["program_steps"] += n
        self.stats["sampling_launches"] = self.stats.get("sampling_launches", 0) + 1
        self.stats["device_sampled_steps"] = self.stats.get("device_sampled_steps", 0) + n
        cache.advance(batch)
        first = batch.start.to("cpu") + 1
        cols = (first[:, None] + torch.arange(n)[None, :]) % advance.LOG
        return step.buf["token_log"].to("cpu").gather(1, cols)

    def _note_launch(self, step: StaticStep, cache: ModelCache) -> None:
        self._launched_at[id(step)] = (id(cache), list(cache.touches))

    def _require_launched(self, step: StaticStep, slots: torch.Tensor, cache: ModelCache, made: int = 0) -> None:
        """A step from the device continues the shape's previous step: its kernel ran, on these ``slots``
        (the kernel reads the shape's static slots; others would advance one sequence's cache on the host
        while the kernel writes another's), and nothing else touched them since (``ModelCache.touches``:
        ``made`` steps made for this one): a step of another shape (a prefill chunk, a verification) or a
        reset moves a sequence on where the shape's device ids and positions do not follow."""
        if id(step) not in self._kernels or id(step) not in self._launched_at:
            raise ValueError(
                f"no step of shape {step.name} ran yet: the first step of a shape takes its inputs from forward()"
            )
        if not torch.equal(step.slots, slots):
            raise ValueError(
                f"a decode step from the device continues the sequences of the previous step of shape {step.name}"
                f" (slots {step.slots.tolist()}), not slots {slots.tolist()}: run forward() for other sequences"
            )
        cache_id, touches = self._launched_at[id(step)]
        moved = [s for s in slots.tolist() if cache_id != id(cache) or cache.touches[s] != touches[s] + made]
        if moved:
            raise ValueError(
                f"slot(s) {moved} moved on since the previous step of shape {step.name} (another step or a reset "
                "ran on them, or another cache): run forward() to continue them from the host"
            )

    def next_ids(self, B: int, T: int = 1, keep_states: bool = False) -> torch.Tensor:
        """The tokens the last step of shape (B, T) sampled on the device, [B, T] (int64)."""
        return self.static_step(B, T, keep_states).buf["next_ids"].view(B, T)
