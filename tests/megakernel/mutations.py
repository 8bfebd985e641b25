"""Ways to break a valid schedule, each a different hazard (used by the broken-schedule suite and fuzzing)."""

from __future__ import annotations

import dataclasses

from nonstop.runtime.megakernel.tasks import (
    Access,
    BufferInfo,
    Counter,
    OpTiles,
    Region,
    Schedule,
    StageSpec,
    TileSpec,
    Wait,
)
from nonstop.runtime.megakernel.tiling.waits import assemble


def replace_task(s: Schedule, i: int, **changes) -> Schedule:
    tasks = list(s.tasks)
    tasks[i] = dataclasses.replace(tasks[i], **changes)
    return dataclasses.replace(s, tasks=tasks)


def tasks_of(s: Schedule, op_name: str, stage: int = 0) -> list[int]:
    return [i for i, t in enumerate(s.tasks) if s.ops[t.op].name == op_name and t.stage == stage]


def counter_of_op(s: Schedule, op_name: str) -> int:
    return s.tasks[tasks_of(s, op_name)[0]].counter


def drop_wait(s: Schedule, i: int, counter: int) -> Schedule:
    t = s.tasks[i]
    assert any(w.counter == counter for w in t.waits), (s.task_name(i), t.waits)
    return replace_task(s, i, waits=tuple(w for w in t.waits if w.counter != counter))


def change_wait(s: Schedule, i: int, which: int, **changes) -> Schedule:
    """Task i's wait on counter ``which`` with fields changed (``counter``, ``base``, ``per_step``)."""
    t = s.tasks[i]
    return replace_task(
        s, i, waits=tuple(dataclasses.replace(w, **changes) if w.counter == which else w for w in t.waits)
    )


def add_wait(s: Schedule, i: int, counter: int, base: int | None = None) -> Schedule:
    per_step = s.counters[counter].per_step if counter < len(s.counters) else 1
    return replace_task(s, i, waits=s.tasks[i].waits + (Wait(counter, per_step if base is None else base, per_step),))


def widen_region(s: Schedule, i: int, k: int, **box) -> Schedule:
    regions = list(s.tasks[i].regions)
    regions[k] = dataclasses.replace(regions[k], **box)
    return replace_task(s, i, regions=tuple(regions))


def move_before(s: Schedule, moved: list[int], before: int) -> Schedule:
    """Queue order with tasks ``moved`` (contiguous) placed just before task ``before``."""
    rest = [i for i in range(len(s.tasks)) if i not in moved]
    at = rest.index(before)
    order = rest[:at] + moved + rest[at:]
    return dataclasses.replace(s, tasks=[s.tasks[i] for i in order])


def add_orphan_counter(s: Schedule, waiter: int) -> Schedule:
    """A wait on a counter that no task increments."""
    counters = list(s.counters) + [Counter("orphan", 1)]
    s = dataclasses.replace(s, counters=counters)
    return add_wait(s, waiter, len(counters) - 1, base=1)


# ----------------------------------------------------------------------------- small hand-made schedules


def _op(name: str, *tiles: tuple) -> OpTiles:
    return OpTiles(name, name, None, [StageSpec("main", [TileSpec(j, regions) for j, regions in enumerate(tiles)])])


def war_schedule(persistent: bool = False) -> Schedule:
    """x = f(); y = g(x); x = h() — the last write must wait for g's read (write-after-read)."""
    bufs = [BufferInfo("x", 1, 4), BufferInfo("y", 1, 4)]
    x, y = 0, 1
    ops = [
        _op("f", (Region(x, 0, 1, 0, 4, Access.WRITE),)),
        _op("g", (Region(x, 0, 1, 0, 4, Access.READ), Region(y, 0, 1, 0, 4, Access.WRITE))),
        _op("h", (Region(x, 0, 1, 0, 4, Access.WRITE),)),
    ]
    return assemble(bufs, ops, persistent)


def accumulate_schedule(persistent: bool = False) -> Schedule:
    """x = 0 (one tile), then three tiles add into all of x (split-K), then y = g(x)."""
    bufs = [BufferInfo("x", 2, 4), BufferInfo("y", 2, 4)]
    zero = (Region(0, 0, 2, 0, 4, Access.WRITE),)
    add = (Region(0, 0, 2, 0, 4, Access.ACCUMULATE),)
    ops = [
        _op("zero", zero),
        _op("add", add, add, add),
        _op("g", (Region(0, 0, 2, 0, 4, Access.READ), Region(1, 0, 2, 0, 4, Access.WRITE))),
    ]
    return assemble(bufs, ops, persistent)


def append_schedule() -> Schedule:
    """Persistent: two tiles of a append rows to a cache, two tiles of b read them. Step e+1's a conflicts
    with nothing of step e (its rows are new), so only the epoch rule orders a's steps."""
    bufs = [BufferInfo("cache", 2, 4, kind="cache", append_only=True), BufferInfo("y", 2, 4)]
    ops = [
        _op("a", *[(Region(0, r, r + 1, 0, 4, Access.WRITE),) for r in range(2)]),
        _op(
            "b", *[(Region(0, r, r + 1, 0, 4, Access.READ), Region(1, r, r + 1, 0, 4, Access.WRITE)) for r in range(2)]
        ),
    ]
    return assemble(bufs, ops, True)
