"""The megakernel's Schedule: a decode step as tasks (tiles of super-ops) with counters and waits.

A persistent kernel's workers take *tickets* from one global atomic counter: ticket q is task
``i = q % N`` of step ``e = q // N`` (N tasks per step). A task

  1. issues the loads of its weight slices (``weights``: they depend on no activation),
  2. waits until every ``Wait`` holds: ``counters[w.counter] >= e * w.per_step + w.base``,
  3. runs the tile function of its ``opcode`` on tile ``tile`` of op ``op`` (reading and writing
     ``regions``), and
  4. adds 1 to ``counters[counter]`` (release).

Counters are never reset: counter c grows by ``counters[c].per_step`` per step (one per task that
increments it), so a wait with ``base == per_step`` means "all of this step's increments" and
``base == 0`` "all of the previous step's" (true at once in step 0). Tasks are in a topological
order: a task waits only on tasks before it in the queue, so handing tickets out in order cannot
deadlock, at any number of workers (and the Triton interpreter, which runs programs one after
another, works too).

Counters belong to one stage of one op (``assemble``: one per (op, stage), or one per set of buffers
its tiles write), and a consumer's waits are derived from the buffer regions tasks declare: the fewest
waits that order every read after the writes it must see, every write after the reads and writes it
must follow, and accumulates (split-K atomics, which commute) after writes and reads.

``persistent`` schedules run many steps in one launch (the step's last op writes the next step's
token ids), so the validator also orders step e+1's accesses after step e's; otherwise the host
launches once per step with ``e`` as an argument and the launch boundary orders the steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nonstop.runtime.megakernel.frontier import Frontier, counter_of, epoch_of, key_of
from nonstop.runtime.megakernel.regions import Access, Region


class ScheduleError(ValueError):
    """A schedule that is not safe to launch; the message names the task and the buffer or counter."""


@dataclass(frozen=True)
class BufferInfo:
    """A buffer seen as ``[rows, cols]``.

    kind: ``activation`` (a Program buffer), ``scratch`` (owned by the schedule, e.g. split-KV partials),
    ``cache`` (an attention cache layer: rows = the step's new tokens, append-only) or ``state``
    (per-sequence KDA state: rows = sequences). ``layer`` / ``tensor`` name the cache tensor.
    """

    name: str
    rows: int
    cols: int
    kind: str = "activation"
    append_only: bool = False
    layer: int | None = None
    tensor: str | None = None

    @property
    def size(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class WeightSlice:
    """Part of a weight tensor a task streams: ``op.weights[role]`` narrowed to ``[start, stop)`` along
    ``dim`` (dim -1: the whole tensor). ``dynamic``: the index along dim 0 is known only at run time
    (the routed expert of a stacked expert tensor, the token's embedding row); the slice lies within
    that index, and its loads can be issued once routing (or the token) is known."""

    role: str
    dim: int
    start: int
    stop: int
    nbytes: int
    dynamic: bool = False


@dataclass(frozen=True)
class TileSpec:
    """One tile of a stage: the index its tile function receives, its regions and weight slices."""

    tile: int
    regions: tuple[Region, ...]
    weights: tuple[WeightSlice, ...] = ()
    label: str = ""


@dataclass
class StageSpec:
    """Tiles of an op that run without waiting on each other; stages of an op run in order."""

    name: str
    tiles: list[TileSpec]


@dataclass
class OpTiles:
    """An op's tiling. ``program_op``: its index in ``Program.ops`` (None for schedule-only ops)."""

    name: str
    kind: str
    program_op: int | None
    stages: list[StageSpec]


@dataclass(frozen=True)
class Wait:
    counter: int
    base: int
    per_step: int

    def target(self, epoch: int) -> int:
        return epoch * self.per_step + self.base


@dataclass(frozen=True)
class Counter:
    name: str
    per_step: int  # increments per step: the number of tasks that increment it


@dataclass(frozen=True)
class Task:
    op: int  # index into Schedule.ops
    stage: int
    tile: int
    opcode: int
    regions: tuple[Region, ...]
    counter: int
    waits: tuple[Wait, ...]
    weights: tuple[WeightSlice, ...] = ()
    label: str = ""

    @property
    def weight_bytes(self) -> int:
        return sum(w.nbytes for w in self.weights)


@dataclass
class Schedule:
    buffers: list[BufferInfo]
    ops: list[OpTiles]
    counters: list[Counter]
    tasks: list[Task]
    persistent: bool
    B: int = 1
    T: int = 1
    opcodes: list[tuple[str, str]] = field(default_factory=list)  # opcode -> (kind, stage name)
    config: object = None  # the TilingConfig a Program's schedule was tiled with

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    def task_name(self, i: int) -> str:
        t = self.tasks[i]
        op = self.ops[t.op]
        stage = op.stages[t.stage].name if t.stage < len(op.stages) else str(t.stage)
        return f"#{i} {op.name}/{stage}[{t.label or t.tile}]"

    def counter_name(self, c: int) -> str:
        return f"counter {c} ({self.counters[c].name})" if 0 <= c < len(self.counters) else f"counter {c}"

    def buffer_index(self, name: str) -> int:
        return next(i for i, b in enumerate(self.buffers) if b.name == name)

    def tasks_of_counter(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.counters]
        for i, t in enumerate(self.tasks):
            if 0 <= t.counter < len(out):
                out[t.counter].append(i)
        return out

    def prefetch_order(self) -> list[tuple[int, WeightSlice]]:
        """(task, weight slice) in the order the weights should be requested: queue order, each task's
        slices before its waits (a worker may also run ahead to the next tickets' slices)."""
        return [(i, w) for i, t in enumerate(self.tasks) for w in t.weights]


def assemble(buffers: list[BufferInfo], ops: list[OpTiles], persistent: bool, B: int = 1, T: int = 1, opcodes: list[tuple[str, str]] | None = None, split_counters: bool = False) -> Schedule:
    """Tasks in op / stage / tile order, counters, and the fewest waits that order every conflicting
    access (derived with the same frontier rules the validator checks).

    One counter per (op, stage); with ``split_counters`` one per (op, stage, set of buffers a tile
    writes), so a consumer waits only for the tiles that produce what it reads: e.g. moe_experts then
    waits for moe_front's router and latent tiles but not its shared-expert tiles, and mla_q_up not for
    mla_in_proj's gate tiles. ``opcodes``: the kernel's dispatch table of (kind, stage name); by default
    the pairs in order of first appearance."""
    table = list(opcodes) if opcodes is not None else []
    counters: list[Counter] = []
    stage_of: list[tuple[int, int]] = []  # (op, stage) of each counter
    raw: list[tuple[int, int, TileSpec, int]] = []
    for oi, op in enumerate(ops):
        for si, stage in enumerate(op.stages):
            if not stage.tiles:
                continue
            pair = (op.kind, stage.name)
            if pair not in table:
                if opcodes is not None:
                    raise ScheduleError(f"{op.name}: no opcode for kind {op.kind!r} stage {stage.name!r}")
                table.append(pair)
            groups: dict[tuple, int] = {}
            for spec in stage.tiles:
                written = tuple(sorted({r.buffer for r in spec.regions if r.access in (Access.WRITE, Access.ACCUMULATE)})) if split_counters else ()
                if written not in groups:
                    groups[written] = len(counters)
                    suffix = ":" + "+".join(buffers[b].name for b in written) if split_counters else ""
                    counters.append(Counter(f"{op.name}/{stage.name}{suffix}", 0))
                    stage_of.append((oi, si))
                c = groups[written]
                counters[c] = Counter(counters[c].name, counters[c].per_step + 1)
                raw.append((oi, si, spec, c))
    names = [f"{ops[oi].name}/{ops[oi].stages[si].name}[{spec.label or spec.tile}]" for oi, si, spec, _ in raw]
    waits = derive_waits(buffers, [(spec.regions, c) for _, _, spec, c in raw], counters, persistent, names, stage_of)
    tasks = []
    for (oi, si, spec, c), w in zip(raw, waits):
        code = table.index((ops[oi].kind, ops[oi].stages[si].name))
        tasks.append(Task(oi, si, spec.tile, code, spec.regions, c, w, spec.weights, spec.label))
    return Schedule(buffers, ops, counters, tasks, persistent, B, T, table)


def derive_waits(buffers: list[BufferInfo], items: list[tuple[tuple[Region, ...], int]], counters: list[Counter], persistent: bool, names=None, stage_of=None) -> list[tuple[Wait, ...]]:
    """Waits for tasks ``items`` = [(regions, counter)] in queue order.

    Step 0 of the sweep gives same-step needs (wait base = per_step); step 1 adds what step e+1 needs
    from step e (base 0), plus the rule that a counter's step-(e+1) increments follow its step-e ones.
    Waits implied by others (through the counters' ancestor sets) are dropped.
    """
    C = len(counters)
    anc0 = [0] * C  # counters whose same-step increments all happen before every increment of c
    anc1 = [0] * C  # ... whose previous-step increments do
    frontier = Frontier([b.size for b in buffers], [b.cols for b in buffers], [b.append_only for b in buffers])
    flat = [frontier.flatten(regions) for regions, _ in items]
    same_step: list[list[int]] = []
    for t, (_, c) in enumerate(items):
        needs = {counter_of(k) for k in frontier.required(flat[t])}
        siblings = [n for n in needs if (stage_of[n] == stage_of[c] if stage_of else n == c)]
        if siblings:
            who = names[t] if names else f"task {t}"
            raise ScheduleError(f"tiles of one stage conflict: {who} touches what a sibling tile ({counters[siblings[0]].name}) writes; tiles of a stage run unordered")
        chosen = _reduce(needs, anc0)
        same_step.append(chosen)
        for n in chosen:
            anc0[c] |= (1 << n) | anc0[n]
        frontier.apply(flat[t], key_of(c, 0))
    prev_step: list[list[int]] = [[] for _ in items]
    if persistent:
        frontier.next_step()
        for t, (_, c) in enumerate(items):
            required = frontier.required(flat[t])
            a1 = 0
            for n in same_step[t]:
                a1 |= anc1[n]
            needs = {counter_of(k) for k in required if epoch_of(k) == 0} | {c}
            remaining = {n for n in needs if not (a1 >> n) & 1}
            chosen = _reduce(remaining, anc0)
            for n in chosen:
                a1 |= (1 << n) | anc0[n]
            anc1[c] |= a1
            prev_step[t] = chosen
            frontier.apply(flat[t], key_of(c, 1))
    return [tuple(Wait(n, counters[n].per_step, counters[n].per_step) for n in same) + tuple(Wait(n, 0, counters[n].per_step) for n in prev) for same, prev in zip(same_step, prev_step)]


def _reduce(needs: set[int], anc: list[int]) -> list[int]:
    """The needs not already implied by another need (n is implied by m when n is an ancestor of m)."""
    cover = 0
    for m in needs:
        cover |= anc[m]
    return sorted(n for n in needs if not (cover >> n) & 1)


def build_schedule(program, B: int = 1, T: int = 1, config=None, persistent: bool = True, split_counters: bool = False) -> Schedule:
    """The Schedule of a decode ``Program`` for B sequences x T new tokens each.

    persistent: steps run back to back in one launch (the step ends with greedy sampling into ``ids``);
    otherwise one launch per step, the host writing ``ids`` in between. split_counters: see ``assemble``.
    """
    from nonstop.runtime.megakernel.tilectx import TilingConfig
    from nonstop.runtime.megakernel.tiling import OPCODES, tile_program

    config = config or TilingConfig()
    buffers, ops = tile_program(program, B, T, config, persistent)
    schedule = assemble(buffers, ops, persistent, B, T, list(OPCODES), split_counters)
    schedule.config = config
    return schedule
