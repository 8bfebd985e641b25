"""Gaps a mutation audit of the megakernel's checks found: hand-made schedules (no ``assemble``, whose waits
follow the same frontier rules the validator checks) with exactly one hazard each, which the static
validator must reject and the simulator must show; and the schedule statistics against hand counts."""

from __future__ import annotations

import pytest

from nonstop.runtime.megakernel import ScheduleError, hunt, validate
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


def _schedule(buffers, tasks, persistent=True) -> Schedule:
    """One op per task (named after its index), one counter per task."""
    ops = [
        OpTiles(f"op{i}", f"op{i}", None, [StageSpec("main", [TileSpec(0, t.regions)])]) for i, t in enumerate(tasks)
    ]
    counters = [Counter(f"c{i}", 1) for i in range(len(tasks))]
    return Schedule(buffers, ops, counters, tasks, persistent)


def _task(i: int, regions, waits) -> Task:
    return Task(i, 0, 0, i, tuple(regions), i, tuple(Wait(c, b, 1) for c, b in waits))


CACHE = BufferInfo("cache", 1, 4, kind="cache", append_only=True)


def _past_read_after_accumulate(wait_on_accumulate: bool) -> Schedule:
    """Per step: 0 writes the step's cache row, 1 accumulates into it, 2 reads the previous step's row. Each
    task waits on its own counter's previous step (epoch chaining); 1 waits for 0 in its step; 2 waits for the
    previous step's 0 and, when ``wait_on_accumulate``, the previous step's 1."""
    row = (0, 0, 1, 0, 4)
    return _schedule(
        [CACHE],
        [
            _task(0, [Region(*row, Access.WRITE)], [(0, 0)]),
            _task(1, [Region(*row, Access.ACCUMULATE)], [(0, 1), (1, 0)]),
            _task(2, [Region(*row, Access.READ_PAST)], [(0, 0), (2, 0)] + ([(1, 0)] if wait_on_accumulate else [])),
        ],
    )


def test_a_past_read_must_follow_the_previous_steps_accumulates():
    """READ_PAST reads what the previous step left in the cache rows: its accumulates as well as its write."""
    validate(_past_read_after_accumulate(True))
    broken = _past_read_after_accumulate(False)
    with pytest.raises(ScheduleError, match=r"race on cache\[row 0, cols 0:4\]: task #2 op2/main\[0\] reads "):
        validate(broken)
    assert hunt(broken, steps=2, workers=4, seeds=2) is not None


def test_a_wait_on_a_counter_one_of_whose_tasks_comes_later_is_a_deadlock():
    """Counter 0 is incremented by tasks 0 and 2; task 1 waits for both of its increments. The first
    incrementer comes earlier, but the second comes after the waiter: one worker holding ticket 1 waits for
    ever (rule 4 looks at the last incrementer, not the first)."""
    x, y, z = BufferInfo("x", 1, 4), BufferInfo("y", 1, 4), BufferInfo("z", 1, 4)
    tasks = [
        Task(0, 0, 0, 0, (Region(0, 0, 1, 0, 4, Access.WRITE),), 0, ()),
        Task(
            1, 0, 0, 1, (Region(0, 0, 1, 0, 4, Access.READ), Region(1, 0, 1, 0, 4, Access.WRITE)), 1, (Wait(0, 2, 2),)
        ),
        Task(2, 0, 0, 2, (Region(2, 0, 1, 0, 4, Access.WRITE),), 0, ()),
    ]
    ops = [
        OpTiles(f"op{i}", f"op{i}", None, [StageSpec("main", [TileSpec(0, t.regions)])]) for i, t in enumerate(tasks)
    ]
    broken = Schedule([x, y, z], ops, [Counter("c0", 2), Counter("c1", 1)], tasks, persistent=False)
    with pytest.raises(ScheduleError, match=r"task #1 op1/main\[0\] waits on counter 0 \(c0\), which task #2 "):
        validate(broken)
    assert hunt(broken, steps=2, workers=1, seeds=0).deadlock is not None


def test_schedule_stats_by_hand():
    """x = f(); y[:, :2], y[:, 2:] = g(x) (two tiles); z = h(y), persistent: each task also waits on the previous
    step of its own counter and of the readers of what it writes. By hand: 4 tasks, 10 waits (7 on the
    previous step, at most 3 a task), depth 3 (f -> g -> h: previous-step waits add no level), weight bytes
    100 + 300 with 2 tasks streaming none."""
    from nonstop.runtime.megakernel.tasks import WeightSlice
    from nonstop.runtime.megakernel.verify.stats import format_stats, schedule_stats

    bufs = [BufferInfo("x", 1, 4), BufferInfo("y", 1, 4), BufferInfo("z", 1, 4)]

    def w(n):
        return (WeightSlice("w", 0, 0, 1, n),)

    tasks = [
        Task(0, 0, 0, 0, (Region(0, 0, 1, 0, 4, Access.WRITE),), 0, (Wait(0, 0, 1), Wait(1, 0, 2)), w(100)),
        *(
            Task(
                1,
                0,
                k,
                1,
                (Region(0, 0, 1, 0, 4, Access.READ), Region(1, 0, 1, 2 * k, 2 * k + 2, Access.WRITE)),
                1,
                (Wait(0, 1, 1), Wait(1, 0, 2), Wait(2, 0, 1)),
            )
            for k in range(2)
        ),
        Task(
            2,
            0,
            0,
            2,
            (Region(1, 0, 1, 0, 4, Access.READ), Region(2, 0, 1, 0, 4, Access.WRITE)),
            2,
            (Wait(1, 2, 2), Wait(2, 0, 1)),
            w(300),
        ),
    ]
    ops = [
        OpTiles(name, kind, None, [StageSpec("main", [TileSpec(t.tile, t.regions) for t in tasks if t.op == i])])
        for i, (name, kind) in enumerate([("f", "gemv"), ("g", "rows"), ("h", "gemv")])
    ]
    s = Schedule(bufs, ops, [Counter("f", 1), Counter("g", 2), Counter("h", 1)], tasks, persistent=True)
    validate(s)
    st = schedule_stats(s)
    assert (st["tasks"], st["ops"], st["counters"], st["buffers"]) == (4, 3, 3, 3)
    assert (st["waits"], st["waits_per_task_max"], st["previous_step_waits"]) == (10, 3, 7)
    assert st["depth"] == 3
    assert st["weight_bytes"] == 400 and st["tasks_without_weights"] == 2
    assert st["weight_bytes_percentiles"][0] == 0 and st["weight_bytes_percentiles"][100] == 300
    assert st["kinds"] == {"gemv": {"tasks": 2, "weight_bytes": 400}, "rows": {"tasks": 2, "weight_bytes": 0}}
    assert "depth 3 (tasks per level 1.3)" in format_stats(s)


@pytest.mark.parametrize(
    "box", [(0, 3, 0, 4), (0, 2, 0, 5), (1, 1, 0, 4), (0, 2, 2, 2)], ids=["row-past", "col-past", "no-rows", "no-cols"]
)
def test_a_region_outside_or_empty_in_its_buffer_is_refused(box):
    """x is [2, 4]: a box one row or column past its end, or with no rows or columns, is refused (by hand)."""
    x = BufferInfo("x", 2, 4)
    s = _schedule([x], [_task(0, [Region(0, *box, Access.WRITE)], [])], persistent=False)
    with pytest.raises(ScheduleError, match=r"outside \(or an empty part of\) x \[2, 4\]"):
        validate(s)
    validate(_schedule([x], [_task(0, [Region(0, 0, 2, 0, 4, Access.WRITE)], [])], persistent=False))


def test_a_past_read_of_a_buffer_that_is_not_append_only_is_refused():
    """READ_PAST means "rows earlier steps appended": on a plain buffer it would order nothing."""
    x = BufferInfo("x", 1, 4)
    s = _schedule([x], [_task(0, [Region(0, 0, 1, 0, 4, Access.READ_PAST)], [(0, 0)])])
    with pytest.raises(ScheduleError, match=r"task #0 op0/main\[0\] reads earlier steps' rows of x, which is not an"):
        validate(s)


def test_a_counter_whose_recorded_growth_is_not_its_task_count_is_refused():
    """Two tasks increment counter 0 but it records per_step 1 (the waits on it are right: e*2 + 2)."""
    x = BufferInfo("x", 1, 4)
    tasks = [Task(0, 0, k, 0, (Region(0, 0, 1, 2 * k, 2 * k + 2, Access.WRITE),), 0, ()) for k in range(2)] + [
        Task(1, 0, 0, 1, (Region(0, 0, 1, 0, 4, Access.READ),), 1, (Wait(0, 2, 2),))
    ]
    ops = [
        OpTiles(
            f"op{i}", f"op{i}", None, [StageSpec("main", [TileSpec(t.tile, t.regions) for t in tasks if t.op == i])]
        )
        for i in range(2)
    ]
    broken = Schedule([x], ops, [Counter("c0", 1), Counter("c1", 1)], tasks, persistent=False)
    with pytest.raises(ScheduleError, match=r"counter 0 \(c0\) records per_step 1 but 2 tasks increment it"):
        validate(broken)
    validate(Schedule([x], ops, [Counter("c0", 2), Counter("c1", 1)], tasks, persistent=False))


def test_the_write_audit_allows_exactly_the_declared_modifications():
    """The audit's mask is the union of a task's WRITE and ACCUMULATE boxes of the named buffer (not its reads,
    not other buffers' boxes), and an element that holds NaN before and after did not change."""
    import types

    import torch

    from nonstop.runtime.megakernel.verify.audit import _changed, allowed

    x, y = BufferInfo("x", 2, 4), BufferInfo("y", 2, 4)
    task = _task(
        0,
        [
            Region(0, 0, 2, 0, 4, Access.READ),
            Region(0, 0, 1, 1, 3, Access.WRITE),
            Region(0, 1, 2, 3, 4, Access.ACCUMULATE),
            Region(1, 0, 2, 0, 4, Access.WRITE),
        ],
        [],
    )
    s = _schedule([x, y], [task], persistent=False)
    want = torch.zeros(2, 4, dtype=torch.bool)
    want[0, 1:3] = True
    want[1, 3] = True
    views = {"buf.x": torch.zeros(2, 4), "buf.y": torch.zeros(2, 4), "buf.z": torch.zeros(2, 4)}
    masks = allowed(s, task, types.SimpleNamespace(batch=None), views)
    assert torch.equal(masks["buf.x"], want)
    assert masks["buf.y"].all() and "buf.z" not in masks  # z: no declared write, no change allowed
    nan = float("nan")
    before, after = torch.tensor([nan, 1.0, 2.0, nan]), torch.tensor([nan, 1.0, 3.0, 0.0])
    assert _changed(before, after).tolist() == [False, False, True, True]
    assert _changed(torch.tensor([1, 2]), torch.tensor([1, 5])).tolist() == [False, True]


def test_the_simulator_checks_each_counters_final_value():
    """Counter 0 records 2 increments a step but one task increments it: after one step it ends at 1."""
    from nonstop.runtime.megakernel import simulate

    x = BufferInfo("x", 1, 4)
    ops = [OpTiles("op0", "op0", None, [StageSpec("main", [TileSpec(0, (Region(0, 0, 1, 0, 4, Access.WRITE),))])])]
    tasks = [Task(0, 0, 0, 0, (Region(0, 0, 1, 0, 4, Access.WRITE),), 0, ())]
    r = simulate(Schedule([x], ops, [Counter("c0", 2)], tasks, persistent=False), steps=1, workers=1)
    assert r.counter_errors == ["counter 0 (c0) ends at 1, expected 1 * 2"] and r.hazard


def test_the_simulator_catches_a_past_read_before_the_previous_steps_write():
    """Task 1 reads the cache row task 0 wrote in the previous step but waits only on its own counter."""
    row = (0, 0, 1, 0, 4)
    s = _schedule(
        [CACHE],
        [_task(0, [Region(*row, Access.WRITE)], [(0, 0)]), _task(1, [Region(*row, Access.READ_PAST)], [(1, 0)])],
    )
    with pytest.raises(ScheduleError, match=r"race on cache\[row 0, cols 0:4\]: task #1 op1/main\[0\] reads earlier"):
        validate(s)
    found = hunt(s, steps=2, workers=4, seeds=0)
    assert found is not None and "read previous steps' rows before the previous step's write" in found.summary()


def test_checksum_past_reads_see_the_previous_steps_rows_weighted_by_position():
    """Step 0 writes the cache row [1, 2] (values (k+1)·v + 7 with v = 1: 8, 9); step 1's READ_PAST sees those,
    position-weighted (1·8 + 2·9 = 26), not step 1's own row."""
    import numpy as np

    from nonstop.runtime.megakernel.verify.checksum import ChecksumActions
    from nonstop.runtime.megakernel.verify.simulate import run_sequential

    cache = BufferInfo("cache", 1, 2, kind="cache", append_only=True)
    row = (0, 0, 1, 0, 2)
    s = _schedule(
        [cache],
        [
            _task(0, [Region(*row, Access.WRITE)], [(0, 0)]),
            _task(1, [Region(*row, Access.READ_PAST)], [(0, 0), (1, 0)]),
        ],
    )
    validate(s)
    one = ChecksumActions(s)
    run_sequential(s, 1, one)
    assert one.values[(0, 0)] == 1 and np.array_equal(one.buffers[(0, 0)], [8, 9])
    seed = ChecksumActions(s).start(1, 1)  # step 1's value over an empty (zero) past
    two = ChecksumActions(s)
    run_sequential(s, 2, two)
    assert two.values[(1, 1)] == seed + 1 * 8 + 2 * 9


def test_split_kv_partials_merge_to_the_softmax_over_the_visible_keys():
    """The simulator's split-KV twin: 7 keys in splits of 2 (4 splits, the last one short), key 5 masked out;
    merging the per-split (max, denominator, Σ p·v) gives plain softmax attention over the visible keys."""
    import torch

    from nonstop.runtime.megakernel.verify.twins import _merge, _split_partials

    gen = torch.Generator().manual_seed(0)
    B, T, H, S, D = 2, 1, 3, 7, 4
    scores = torch.randn(B, T, H, S, generator=gen) * 3
    values = torch.randn(B, S, H, D, generator=gen)
    visible = torch.ones(B, T, S, dtype=torch.bool)
    visible[:, :, 5] = False
    cells = _split_partials(scores, values, visible, split=2, NS=4)
    got = _merge(cells)  # [B, T, H, D]
    p = torch.softmax(scores.masked_fill(~visible[:, :, None, :], float("-inf")), dim=-1)
    want = torch.einsum("bths,bshd->bthd", p, values)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
