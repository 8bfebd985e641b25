"""``megakernel.tasks`` helpers on a small hand-built schedule: names used in the validator's and the
simulator's messages (also for malformed tasks, which must still be named, not raise), the tasks of each
counter, buffer lookup by exact name, the weight prefetch order and a region's flat element ranges.
Every expected value is written out by hand."""

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
    WeightSlice,
)


def w(role, nbytes):
    return WeightSlice(role, 0, 0, 1, nbytes)


def schedule() -> Schedule:
    ops = [
        OpTiles("L0.qkv", "gemv", 0, [StageSpec("main", [])]),
        OpTiles("L0.attn", "gqa_attn", 1, [StageSpec("split", []), StageSpec("merge", [])]),
    ]
    buffers = [BufferInfo("h_out", 2, 8), BufferInfo("h", 2, 8)]  # "h" is a prefix of "h_out"
    counters = [Counter("qkv", 2), Counter("attn", 1)]
    tasks = [
        Task(0, 0, 0, 0, (), 0, (), (w("a", 3), w("b", 5)), "cols 0:4"),
        Task(1, 0, 0, 1, (), 1, (), (w("c", 7),)),
        Task(0, 0, 1, 0, (), 0, (), (w("d", 11),), "cols 4:8"),
        Task(1, 2, 3, 2, (), 5, ()),  # malformed: stage 2 of an op of two stages, counter 5 of 2
        Task(1, 1, 0, 2, (), -1, ()),  # malformed: a negative counter
    ]
    return Schedule(buffers, ops, counters, tasks, persistent=True)


def test_a_task_of_a_stage_the_op_does_not_have_is_named_by_its_number():
    """``task_name`` is used to report malformed schedules: a stage index equal to the op's stage count
    must be named by its number, not raise an IndexError (an off-by-one in the range check)."""
    s = schedule()
    assert s.task_name(0) == "#0 L0.qkv/main[cols 0:4]"
    assert s.task_name(1) == "#1 L0.attn/split[0]"
    assert s.task_name(3) == "#3 L0.attn/2[3]"
    assert s.task_name(4) == "#4 L0.attn/merge[0]"


def test_counter_names_outside_the_schedule_are_plain_numbers():
    """``counter_name`` of a counter index one past the end or negative names only the number (an off-by-one
    or a missing lower bound raises IndexError or names the wrong counter)."""
    s = schedule()
    assert s.counter_name(0) == "counter 0 (qkv)" and s.counter_name(1) == "counter 1 (attn)"
    assert s.counter_name(2) == "counter 2"
    assert s.counter_name(-1) == "counter -1"


def test_tasks_of_counter_in_queue_order_ignoring_out_of_range_counters():
    """Each counter's incrementing tasks, in queue order; a task whose counter is out of range (negative or
    past the end) is left out rather than appended to another counter's list or raising."""
    assert schedule().tasks_of_counter() == [[0, 2], [1]]


def test_buffer_index_matches_the_whole_name():
    """``buffer_index`` finds the buffer whose name is exactly the one asked for, not the first whose name
    contains it."""
    s = schedule()
    assert s.buffer_index("h") == 1 and s.buffer_index("h_out") == 0


def test_prefetch_order_lists_every_slice_of_every_task_in_queue_order():
    """All weight slices, tasks in queue order and each task's slices in its own order (not only the first
    slice of a task, not tasks reversed)."""
    order = [(i, x.role) for i, x in schedule().prefetch_order()]
    assert order == [(0, "a"), (0, "b"), (1, "c"), (2, "d")]
    assert [t.weight_bytes for t in schedule().tasks] == [8, 7, 11, 0, 0]


def test_region_intervals_by_hand():
    """Flat element ranges of boxes in a buffer of 10 columns: whole rows are one interval; a column range
    is one interval per row."""
    assert Region(0, 1, 3, 0, 10, Access.READ).intervals(10) == [(10, 30)]
    assert Region(0, 1, 3, 2, 5, Access.READ).intervals(10) == [(12, 15), (22, 25)]
    assert Region(0, 0, 2, 0, 4, Access.WRITE).intervals(10) == [(0, 4), (10, 14)]
    assert Region(0, 2, 3, 6, 10, Access.WRITE).intervals(10) == [(26, 30)]
    assert BufferInfo("x", 3, 10).size == 30


def test_boxes_that_only_touch_do_not_overlap():
    """``Region.overlaps`` uses half-open ranges: boxes sharing only an edge row or column do not overlap,
    boxes of different buffers never do; the schedule counts its tasks."""
    a = Region(0, 0, 2, 0, 4, Access.READ)
    assert a.overlaps(Region(0, 1, 3, 3, 6, Access.WRITE))
    assert not a.overlaps(Region(0, 2, 3, 0, 4, Access.WRITE))  # the next rows
    assert not Region(0, 2, 3, 0, 4, Access.WRITE).overlaps(a)
    assert not a.overlaps(Region(0, 0, 2, 4, 8, Access.WRITE))  # the next columns
    assert not Region(0, 0, 2, 4, 8, Access.WRITE).overlaps(a)
    assert not a.overlaps(Region(1, 0, 2, 0, 4, Access.WRITE))
    assert schedule().num_tasks == 5
