"""Hand-made megakernel schedules for validator and simulator tests: 1x4 buffers, one op per distinct
``Task.op`` and tasks written as (op, regions, counter, waits)."""

from __future__ import annotations

from nonstop.runtime.megakernel.tasks import (
    Access,
    BufferInfo,
    Counter,
    OpTiles,
    Region,
    Schedule,
    StageSpec,
    Task,
    TileSpec,
    Wait,
)

X, Y, Z, W = (BufferInfo(n, 1, 4) for n in "xyzw")
CACHE = BufferInfo("cache", 1, 4, kind="cache", append_only=True)


def sched(buffers, tasks, counters, persistent=False, kinds=None) -> Schedule:
    """One op per distinct ``Task.op`` (named op<i>, of kind ``kinds[i]``, default op<i> too), its tiles the
    tasks of that op; counter k expects ``counters[k]`` increments a step."""
    nops = 1 + max(t.op for t in tasks)
    kinds = kinds or [f"op{i}" for i in range(nops)]
    ops = [
        OpTiles(
            f"op{i}", kinds[i], None, [StageSpec("main", [TileSpec(t.tile, t.regions) for t in tasks if t.op == i])]
        )
        for i in range(nops)
    ]
    return Schedule(buffers, ops, [Counter(f"c{k}", n) for k, n in enumerate(counters)], tasks, persistent)


def region(b: int, access: Access, c0: int = 0, c1: int = 4) -> Region:
    """Columns c0:c1 of the one row of buffer ``b``."""
    return Region(b, 0, 1, c0, c1, access)


def task(op: int, regions, counter: int, waits=(), tile: int = 0) -> Task:
    """A task of ``op`` (stage 0), incrementing ``counter``, waiting on each (counter, base, per_step) of ``waits``."""
    return Task(op, 0, tile, op, tuple(regions), counter, tuple(Wait(*w) for w in waits))
