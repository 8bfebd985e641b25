"""Simulator actions that run a real Program's schedule on torch tensors, tile by tile.

A task's action at *start* runs its stage twin (``twins.py``) on a private copy of the step
state (activation buffers, scratch, the op's cache layer) and keeps the values of the regions it
writes; at *finish* it stores exactly those regions into the shared state (accumulating tiles add
their contribution). So a tile's outputs are right iff the regions it reads were ready when it
started — the protocol property under test — and nothing outside its regions is ever touched.
A twin run is reused by later tiles of the same op and step while the regions they read still hold
the values it saw (most tiles of an op share one run).

Logical regions map to storage per step: activation buffers and workspaces by row; attention caches
through the page table (row r = token t of sequence b at position start_b + t); KDA state by slot; the
step's ``start`` is the step's ``StepBatch.start`` (the host reserved every step's pages up front, so the
``advance`` task's update of it is the next step's batch). ``advance`` writes the next step's ids: the
fed ids of ``feed`` when given (teacher forcing, as the reference runs), else the sampled ``next_ids``.
"""

from __future__ import annotations

import copy

import torch

from nonstop.program.reference import StepEnv
from nonstop.runtime.megakernel.tasks import Access, Schedule
from nonstop.runtime.megakernel.verify.twins import stage_twin

MODEL_DTYPE_WORKSPACES = ("mlp.h", "moe_experts.act")  # workspaces the kernels keep in the model dtype


def layer_rows(info, layer, batch, r0: int, r1: int) -> torch.Tensor:
    """Rows of a cache layer's storage holding rows [r0, r1) of its schedule buffer ``info`` in a step of
    ``batch``: KDA state (``info.kind`` state) row b -> slot ``slots[b]``; an attention cache row r (token t of
    sequence b) -> its pool row ``pages.rows(slots[b], start[b] + t)``."""
    if info.kind == "state":
        return batch.slots[r0:r1]
    return layer.pages.rows(batch.slots, batch.positions).reshape(-1)[r0:r1]


class ProgramActions:
    """Actions over the step state of ``program`` (the executor's, with the sampling buffers) running
    ``ops`` (the schedule's, ``sample`` and ``advance`` included): ``cache`` (prefilled), one ``StepBatch``
    per step (``batches``, pages reserved up front), the first step's token ids ``ids`` [R] and optionally
    the ids of later steps (``feed[e]``, else the sampled ones)."""

    def __init__(
        self, s: Schedule, program, ops: list, cache, batches: list, ids: torch.Tensor, feed: list | None = None
    ):
        self.s, self.program, self.ops, self.cache, self.batches, self.feed = s, program, ops, cache, batches, feed
        R = s.B * s.T
        self.buf = {k: v.zero_() for k, v in program.allocate(R, ids.device).items()}
        for b in s.buffers:
            if b.kind == "scratch":
                dtype = program.dtype if b.name in MODEL_DTYPE_WORKSPACES else torch.float32
                self.buf[b.name] = torch.zeros(b.rows, b.cols, dtype=dtype)
        self.buf["ids"].copy_(ids)
        self.scratch = {b.name for b in s.buffers if b.kind == "scratch"}
        self.generation = [0] * len(s.buffers)  # bumped whenever a tile stores into the buffer
        self.logits: dict[int, torch.Tensor] = {}  # step -> logits [R, V] as the step produced them
        self.memo: dict[tuple[int, int, int], tuple[StepEnv, StepEnv, list[int]]] = {}
        self.twin_runs = 0

    # ------------------------------------------------------------------ storage of regions
    def env(self, epoch: int, buf=None, cache=None) -> StepEnv:
        return StepEnv(self.buf if buf is None else buf, self.cache if cache is None else cache, self.batches[epoch])

    def _storage(self, env: StepEnv, b: int, r0: int, r1: int, epoch: int, past: bool = False):
        """(2-D tensor, row indices) holding rows [r0, r1) of buffer b in ``env`` at step ``epoch``."""
        info = self.s.buffers[b]
        batch = self.batches[epoch]
        if info.kind in ("activation", "scratch"):
            t = env.buf[info.name]
            return t.view(t.shape[0], -1), slice(r0, r1)
        if info.kind == "step":
            return batch.start.view(-1, 1), slice(r0, r1)
        layer = env.cache.layers[info.layer]
        t = getattr(layer, info.tensor) if info.kind == "state" else layer.tensors[info.tensor]
        if past:  # every earlier token of the region's sequence
            seq = r0 // self.s.T
            positions = torch.arange(int(batch.start[seq]))
            rows = layer.pages.rows(batch.slots[seq : seq + 1], positions[None])[0]
        else:
            rows = layer_rows(info, layer, batch, r0, r1)
        return t.view(t.shape[0], -1), rows

    def view(self, env: StepEnv, region, epoch: int) -> torch.Tensor:
        """The region's values in ``env`` (a view for activations; a gathered copy for caches and state)."""
        t, rows = self._storage(env, region.buffer, region.r0, region.r1, epoch, region.access == Access.READ_PAST)
        return t[rows, region.c0 : region.c1]

    def gather(self, env: StepEnv, region, epoch: int) -> torch.Tensor:
        return self.view(env, region, epoch).clone()

    def scatter(self, region, epoch: int, values: torch.Tensor, add: bool = False, env: StepEnv | None = None) -> None:
        t, rows = self._storage(
            env or self.env(epoch), region.buffer, region.r0, region.r1, epoch, region.access == Access.READ_PAST
        )
        if add:
            values = t[rows, region.c0 : region.c1] + values
        t[rows, region.c0 : region.c1] = values.to(t.dtype)

    # ------------------------------------------------------------------ private copies
    def _copy(self, op) -> tuple[dict, object]:
        """Buffers the op's twins may touch are copied (its reads, writes and the scratch); the rest shared."""
        touched = set(op.reads) | set(op.writes) | self.scratch
        buf = {k: (v.clone() if k in touched else v) for k, v in self.buf.items()}
        cache = copy.copy(self.cache)
        cache.layers = list(self.cache.layers)
        layer = op.attrs.get("cache_layer") if op is not None else None
        if layer is not None:
            cache.layers[layer] = copy.deepcopy(self.cache.layers[layer])
        return buf, cache

    def _same_inputs(self, task, epoch: int, seen: StepEnv, generations: list[int]) -> bool:
        reads = [r for r in task.regions if r.access in (Access.READ, Access.READ_PAST)]
        if all(self.generation[r.buffer] == generations[r.buffer] for r in reads):
            return True
        now = self.env(epoch)
        return all(torch.equal(self.view(now, r, epoch), self.view(seen, r, epoch)) for r in reads)

    def audit(self, i: int, epoch: int = 0, seed: int = 0) -> str | None:
        """Check task i declares everything it reads: run its twin on a copy of the state where every
        float value outside its READ / READ_PAST regions is replaced by random garbage, and on a clean
        copy; its WRITE / ACCUMULATE regions must come out bit-identical. (Garbage rather than NaN: the
        twins multiply masked-out keys by exact zeros, which only NaN would turn into a false alarm.)
        Returns None, or the region that changed. Integer token ids are kept."""
        task = self.s.tasks[i]
        info = self.s.ops[task.op]
        if info.kind == "advance":
            return None
        op = self.ops[info.program_op]
        twin = stage_twin(info.kind, info.stages[task.stage].name)
        kept = [
            (r, self.gather(self.env(epoch), r, epoch))
            for r in task.regions
            if r.access in (Access.READ, Access.READ_PAST)
        ]
        gen = torch.Generator().manual_seed(seed)
        results = []
        for garbage in (False, True):
            buf = {k: v.clone() for k, v in self.buf.items()}
            cache = copy.copy(self.cache)
            cache.layers = [copy.deepcopy(layer) for layer in self.cache.layers]
            if garbage:
                for t in [*buf.values(), *(t for layer in cache.layers for t in _layer_tensors(layer))]:
                    if t.dtype.is_floating_point:
                        t.copy_(torch.randn(t.shape, generator=gen) * 3)
            env = StepEnv(buf, cache, self.batches[epoch])
            for region, values in kept:
                self.scatter(region, epoch, values, env=env)
            for r in task.regions:
                if r.access == Access.ACCUMULATE:
                    buf[self.s.buffers[r.buffer].name].zero_()
            twin(op, env, task, self.s)
            results.append(
                [self.gather(env, r, epoch) for r in task.regions if r.access in (Access.WRITE, Access.ACCUMULATE)]
            )
        written = [r for r in task.regions if r.access in (Access.WRITE, Access.ACCUMULATE)]
        for r, clean, dirty in zip(written, *results):
            if not torch.equal(clean, dirty):
                where = r.describe(self.s.buffers[r.buffer].name)
                return f"task {self.s.task_name(i)}: {where} depends on values outside the regions it declares to read"
        return None

    # ------------------------------------------------------------------ the simulator's interface
    def start(self, i: int, epoch: int):
        task = self.s.tasks[i]
        info = self.s.ops[task.op]
        if info.kind == "advance":
            return None
        if info.kind == "sample" and info.stages[task.stage].name == "pick":  # the logits row it sampled from
            kept = self.logits.setdefault(epoch, torch.full_like(self.buf["logits"], float("nan")))
            kept[task.tile] = self.buf["logits"][task.tile]
        op = self.ops[info.program_op]
        twin = stage_twin(info.kind, info.stages[task.stage].name)
        if any(r.access == Access.ACCUMULATE for r in task.regions):  # this tile's own contribution
            buf, cache = self._copy(op)
            out = StepEnv(buf, cache, self.batches[epoch])
            for r in task.regions:
                if r.access == Access.ACCUMULATE:
                    buf[self.s.buffers[r.buffer].name].zero_()
            twin(op, out, task, self.s)
            self.twin_runs += 1
        else:
            key = (task.op, task.stage, epoch)
            hit = self.memo.get(key)
            if hit is None or not self._same_inputs(task, epoch, hit[0], hit[2]):
                seen = StepEnv(*self._copy(op), self.batches[epoch])
                out = StepEnv(*self._copy(op), self.batches[epoch])
                twin(op, out, task, self.s)
                self.twin_runs += 1
                self.memo[key] = (seen, out, list(self.generation))
            out = self.memo[key][1]
        return [(r, self.gather(out, r, epoch)) for r in task.regions if r.access in (Access.WRITE, Access.ACCUMULATE)]

    def finish(self, i: int, epoch: int, pending) -> None:
        task = self.s.tasks[i]
        if self.s.ops[task.op].kind == "advance":  # the next step's ids of sequence b
            rows = slice(task.tile * self.s.T, (task.tile + 1) * self.s.T)
            fed = self.feed is not None and epoch + 1 < len(self.feed)
            self.buf["ids"][rows] = self.feed[epoch + 1][rows] if fed else self.buf["next_ids"][rows]
            self.buf["sample_offset"][rows] += self.s.T  # the sampler's noise counters move with the positions
            self.generation[self.s.buffer_index("ids")] += 1
            self.generation[self.s.buffer_index("sample_offset")] += 1
            return
        for region, values in pending:
            self.scatter(region, epoch, values, add=region.access == Access.ACCUMULATE)
            self.generation[region.buffer] += 1
        for key in [k for k in self.memo if k[2] < epoch]:  # earlier steps' runs are done with
            del self.memo[key]

    def between_steps(self, epoch: int) -> None:
        """Nothing: the ``advance`` tasks write the next step's ids."""

    def end(self, steps: int) -> dict[int, torch.Tensor]:
        """Logits of every step (as each step's ``sample`` tasks read them) after a run of ``steps`` steps."""
        return self.logits


def _layer_tensors(layer) -> list[torch.Tensor]:
    """The storage tensors of a cache layer (paged pools, or KDA recurrent state and conv windows)."""
    if hasattr(layer, "tensors"):
        return list(layer.tensors.values())
    return [layer.recurrent, layer.conv]
