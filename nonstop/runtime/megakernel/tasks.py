"""The megakernel's task types: what a decode step is made of, for the kernel and for every check.

A step is a ``Schedule``: ``OpTiles`` (one per op of the step: its launch's arguments and its stages,
each a list of ``TileSpec``), ``Task``s in queue order, ``Counter``s and ``Wait``s. A persistent kernel's
workers take *tickets* from one global atomic counter: ticket q is task ``i = q % N`` of step
``e = q // N`` (N tasks per step). A task

  1. requests its weight slices (``weights``: they depend on no activation),
  2. waits until every ``Wait`` holds: ``counters[w.counter] >= e * w.per_step + w.base``,
  3. runs its tile (reading and writing ``regions``), and
  4. adds 1 to ``counters[counter]`` (release).

Counters are never reset: counter c grows by ``counters[c].per_step`` per step (one per task that
increments it), so a wait with ``base == per_step`` means "all of this step's increments" and
``base == 0`` "all of the previous step's" (true at once in step 0). Tasks are in a topological
order: a task waits only on tasks before it in the queue, so handing tickets out in order cannot
deadlock, at any number of workers (and the Triton interpreter, which runs programs one after
another, works too). ``persistent`` schedules run many steps in one launch, so step e+1's accesses are
ordered after step e's too.

Regions. Every buffer a task touches is seen as a 2-D array ``[rows, cols]`` (``cols`` = elements per
row): an activation buffer ``[R, *row_shape]`` has R rows; a per-sequence state (KDA recurrent / conv
windows) has B rows, one per sequence of the step; an attention cache has R rows, the step's new
tokens (older tokens are read with ``READ_PAST``); a workspace has the layout the kernels give it. A
``Region`` is a box of that array: rows ``[r0, r1)`` x columns ``[c0, c1)``. Its elements, in row-major
order, form one flat interval per row, or a single interval when the box spans whole rows.

Access kinds and the orderings they need (a "modification" is a write or an accumulate):
  READ        after every earlier modification of the element.
  WRITE       after every earlier access of the element.
  ACCUMULATE  after every earlier write and read; accumulates commute with each other (split-K
              atomic adds into a zeroed target), so two of them need no order.
  READ_PAST   reads what *previous steps* appended to an append-only buffer (an attention cache):
              after the previous step's writes of the element; never conflicts within a step.
A read-modify-write (``h += y`` on a tile's own columns) is a READ and a WRITE of the same box.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class Access(IntEnum):
    READ = 0
    WRITE = 1
    ACCUMULATE = 2
    READ_PAST = 3


VERB = {
    Access.READ: "reads",
    Access.WRITE: "writes",
    Access.ACCUMULATE: "accumulates into",
    Access.READ_PAST: "reads earlier steps' rows of",
}


@dataclass(frozen=True)
class Region:
    """Box ``[r0, r1) x [c0, c1)`` of buffer ``buffer`` (an index into ``Schedule.buffers``)."""

    buffer: int
    r0: int
    r1: int
    c0: int
    c1: int
    access: Access

    def intervals(self, cols: int) -> list[tuple[int, int]]:
        """Flat element ranges ``[lo, hi)`` of the box in a buffer of ``cols`` columns."""
        if self.c0 == 0 and self.c1 == cols:
            return [(self.r0 * cols, self.r1 * cols)]
        return [(r * cols + self.c0, r * cols + self.c1) for r in range(self.r0, self.r1)]

    def overlaps(self, other: Region) -> bool:
        return (
            self.buffer == other.buffer
            and self.r0 < other.r1
            and other.r0 < self.r1
            and self.c0 < other.c1
            and other.c0 < self.c1
        )

    def describe(self, name: str) -> str:
        return f"{name}[rows {self.r0}:{self.r1}, cols {self.c0}:{self.c1}]"


def describe_elements(name: str, cols: int, lo: int, hi: int) -> str:
    """Human form of the flat element range [lo, hi) of a buffer with ``cols`` columns."""
    r0, c0 = divmod(lo, cols)
    r1, c1 = divmod(hi - 1, cols)
    if r0 == r1:
        return f"{name}[row {r0}, cols {c0}:{c1 + 1}]"
    return f"{name}[elements {lo}:{hi} = row {r0} col {c0} .. row {r1} col {c1}]"


class ScheduleError(ValueError):
    """A schedule that is not safe to launch; the message names the task and the buffer or counter."""


@dataclass(frozen=True)
class BufferInfo:
    """A buffer seen as ``[rows, cols]``.

    kind: ``activation`` (a Program buffer), ``scratch`` (a kernel workspace, e.g. split-KV partials),
    ``cache`` (an attention cache layer: rows = the step's new tokens, append-only), ``state``
    (per-sequence KDA state: rows = sequences; ``layer`` / ``tensor`` name the cache tensor) or ``step``
    (the step's own per-sequence tensors: ``start``).
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
    """An op's tiling. ``program_op``: its index in the step's ops; ``args``: its launch's arguments by
    parameter name (block sizes, tile counts: what the tiling and the checks' twins follow)."""

    name: str
    kind: str
    program_op: int | None
    stages: list[StageSpec]
    args: dict = field(default_factory=dict)


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
