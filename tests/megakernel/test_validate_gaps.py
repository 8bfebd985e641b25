"""Hand-made schedules with exactly one hazard (or none), each checked against the static validator (and,
where the hazard is dynamic, the simulator): the validator must refuse it with a message naming the tasks
and counters involved, and must accept the correct variant. Expected verdicts are worked out by hand."""

from __future__ import annotations

import pytest

from nonstop.runtime.megakernel import ScheduleError, simulate, validate
from nonstop.runtime.megakernel.tasks import Access, BufferInfo, Schedule
from tests.megakernel.hand_schedule import X, Y, Z
from tests.megakernel.hand_schedule import region as _w
from tests.megakernel.hand_schedule import sched as _sched
from tests.megakernel.hand_schedule import task as _t


# x = f(); y = g(x): the smallest producer / consumer pair, one launch per step
def _pair(wait=(0, 1, 1), counters=(1, 1)) -> Schedule:
    return _sched(
        [X, Y],
        [
            _t(0, [_w(0, Access.WRITE)], 0),
            _t(1, [_w(0, Access.READ), _w(1, Access.WRITE)], 1, [wait] if wait else []),
        ],
        counters,
    )


def test_the_correct_pair_is_accepted_and_the_missing_wait_is_a_named_race():
    """Control: g waits for f's increment; without the wait the read-after-write is refused naming both."""
    validate(_pair())
    with pytest.raises(
        ScheduleError,
        match=r"read-after-write race on x\[row 0, cols 0:4\]: task #1 op1/main\[0\] "
        r"reads it, but task #0 op0/main\[0\], which writes it",
    ):
        validate(_pair(wait=None))


def test_a_task_whose_counter_is_one_past_the_last_is_refused_by_name():
    """A task incrementing counter 2 of a 2-counter schedule must be refused with a ScheduleError naming it,
    not crash (IndexError) or pass (an off-by-one bound)."""
    s = _pair()
    s.tasks[1] = _t(1, [_w(0, Access.READ), _w(1, Access.WRITE)], 2, [(0, 1, 1)])
    with pytest.raises(ScheduleError, match=r"task #1 op1/main\[0\] increments counter 2, but the schedule has 2"):
        validate(s)


def test_a_region_of_the_buffer_one_past_the_last_is_refused_by_name():
    """Buffer index 2 in a 2-buffer schedule: refused naming the task, not an IndexError."""
    s = _pair()
    s.tasks[1] = _t(1, [_w(0, Access.READ), _w(2, Access.WRITE)], 1, [(0, 1, 1)])
    with pytest.raises(ScheduleError, match=r"task #1 op1/main\[0\] touches buffer 2, but the schedule has 2 buffers"):
        validate(s)


def test_a_counter_recording_more_increments_than_its_tasks_is_refused():
    """Counter 0 records 2 increments a step but only f increments it: refused in either direction."""
    s = _pair(counters=(2, 1))
    with pytest.raises(ScheduleError, match=r"counter 0 \(c0\) records per_step 2 but 1 tasks increment it"):
        validate(s)


def test_a_wait_on_a_counter_nobody_increments_is_named_as_such():
    """g waits on counter 2, which exists but has no incrementing task: the wait can never be met."""
    s = _sched(
        [X, Y],
        [_t(0, [_w(0, Access.WRITE)], 0), _t(1, [_w(0, Access.READ), _w(1, Access.WRITE)], 1, [(0, 1, 1), (2, 1, 1)])],
        (1, 1, 1),
    )
    with pytest.raises(ScheduleError, match=r"task #1 op1/main\[0\] waits on counter 2 \(c2\), which no task incr"):
        validate(s)


@pytest.mark.parametrize("per_step", [0, 2])
def test_a_wait_whose_epoch_scaling_is_not_the_counters_growth_is_refused(per_step):
    """f increments counter 0 once a step; g's target e*per_step+1 must scale by 1: by 2 it waits for
    increments that never come from step 1 on (deadlock), by 0 it is released by step 0's increment in
    every later step (early release)."""
    s = _pair(wait=(0, 1, per_step))
    with pytest.raises(
        ScheduleError,
        match=rf"task #1 op1/main\[0\] waits on counter 0 \(c0\) with target "
        rf"e\*{per_step}\+1, but counter 0 \(c0\) grows by 1",
    ):
        validate(s)
    r = simulate(s, steps=2, workers=2)
    if per_step == 2:
        assert r.deadlock is not None and "task #1 op1/main[0] waits on counter 0 (c0) at 2 < 3" in r.deadlock


def _two_tile_pair(base: int) -> Schedule:
    """x[:, :2], x[:, 2:] = f() (two tiles, counter 0 grows by 2); y = g(x) waits e*2 + ``base``."""
    return _sched(
        [X, Y],
        [
            _t(0, [_w(0, Access.WRITE, 0, 2)], 0),
            _t(0, [_w(0, Access.WRITE, 2, 4)], 0, tile=1),
            _t(1, [_w(0, Access.READ), _w(1, Access.WRITE)], 1, [(0, base, 2)]),
        ],
        (2, 1),
    )


def test_a_wait_released_after_one_of_two_producers_is_an_early_release():
    """g needs both tiles of f (target 2); target 1 releases it after either tile: refused naming the base,
    and the simulator (second tile stalled) sees g read x before the write finished. Target 2 is accepted."""
    validate(_two_tile_pair(2))
    early = _two_tile_pair(1)
    with pytest.raises(
        ScheduleError,
        match=r"task #2 op1/main\[0\] waits on counter 0 \(c0\) with target base 1: "
        r"must be 2",
    ):
        validate(early)
    r = simulate(early, steps=1, workers=3, stall=1)
    assert any("task #2 op1/main[0] read it before a write of it" in x for x in r.races), r.summary()
    assert simulate(_two_tile_pair(2), steps=2, workers=3, stall=1).ok


def test_a_wait_for_more_increments_than_exist_is_refused():
    """Target base 3 on a counter that grows by 2 can never be met in its step (a deadlock)."""
    s = _two_tile_pair(3)
    with pytest.raises(
        ScheduleError,
        match=r"task #2 op1/main\[0\] waits on counter 0 \(c0\) for 3 increments, but "
        r"only 2 tasks",
    ):
        validate(s)
    assert simulate(s, steps=1, workers=2).deadlock is not None


def test_a_wait_cycle_behind_an_acyclic_prefix_is_reported_as_exactly_the_cycle():
    """Counters 0 -> 1 -> 2 -> 1: task 1 waits on f (c0) and on task 2 (c2), task 2 waits on task 1 (c1). The
    witness must list the cycle 1 -> 2 -> 1 only (not the edge from counter 0 that leads into it)."""
    s = _sched(
        [X, Y, Z],
        [
            _t(0, [_w(0, Access.WRITE)], 0),
            _t(1, [_w(0, Access.READ), _w(1, Access.WRITE)], 1, [(0, 1, 1), (2, 1, 1)]),
            _t(2, [_w(1, Access.READ), _w(2, Access.WRITE)], 2, [(1, 1, 1)]),
        ],
        (1, 1, 1),
    )
    with pytest.raises(ScheduleError) as exc:
        validate(s)
    msg = str(exc.value)
    assert msg == (
        "cycle of waits (deadlock in every interleaving): task #2 op2/main[0] waits on counter 1 (c1) (incremented "
        "by task #1 op1/main[0]); task #1 op1/main[0] waits on counter 2 (c2) (incremented by task #2 op2/main[0])"
    )
    assert simulate(s, steps=1, workers=3).deadlock is not None


def test_a_wait_on_the_very_next_task_in_the_queue_is_refused():
    """Acyclic, but task 0 waits on task 1's counter: with one worker holding ticket 0 nobody runs task 1."""
    s = _sched(
        [X, Y],
        [_t(0, [_w(1, Access.READ), _w(0, Access.WRITE)], 0, [(1, 1, 1)]), _t(1, [_w(1, Access.WRITE)], 1)],
        (1, 1),
    )
    with pytest.raises(
        ScheduleError,
        match=r"task #0 op0/main\[0\] waits on counter 1 \(c1\), which task #1 "
        r"op1/main\[0\] increments later in the queue",
    ):
        validate(s)
    assert simulate(s, steps=1, workers=1).deadlock is not None


def _war_across_steps(f_waits_for_g: bool) -> Schedule:
    """Persistent: x = f(); y = g(x). f of step e+1 overwrites x: it must wait for step e's g to finish
    reading it (g's counter, previous step: base 0). Each task waits on its own counter's previous step."""
    f_waits = [(0, 0, 1)] + ([(1, 0, 1)] if f_waits_for_g else [])
    return _sched(
        [X, Y],
        [
            _t(0, [_w(0, Access.WRITE)], 0, f_waits),
            _t(1, [_w(0, Access.READ), _w(1, Access.WRITE)], 1, [(0, 1, 1), (1, 0, 1)]),
        ],
        (1, 1),
        persistent=True,
    )


def test_a_write_after_read_across_persistent_steps_is_a_named_race():
    """Without f's wait on the previous step's g, step e+1's f may overwrite x while step e's g reads it."""
    validate(_war_across_steps(True))
    broken = _war_across_steps(False)
    with pytest.raises(
        ScheduleError,
        match=r"write-after-read race on x\[row 0, cols 0:4\]: task #0 op0/main\[0\] "
        r"writes it, but task #1 op1/main\[0\], which reads it in the previous step, is not ordered",
    ):
        validate(broken)
    r = simulate(broken, steps=2, workers=2, stall=1)
    assert any("step 1: task #0 op0/main[0] modified it before an earlier reader" in x for x in r.races), r.summary()
    assert simulate(_war_across_steps(True), steps=3, workers=2, stall=1).ok


def test_a_persistent_task_not_chained_to_its_own_previous_step_is_refused():
    """g appends the step's cache row (no conflict with any earlier step's access) and waits on nothing: step
    e+1's g could increment counter 1 before step e's g, releasing a step-e waiter early (the epoch rule).
    With a wait on its own counter's previous step (base 0) it is accepted."""
    cache = BufferInfo("cache", 1, 4, kind="cache", append_only=True)

    def sched(chained):
        return _sched(
            [X, cache],
            [
                _t(0, [_w(0, Access.WRITE)], 0, [(0, 0, 1)]),
                _t(1, [_w(1, Access.WRITE)], 1, [(1, 0, 1)] if chained else []),
            ],
            (1, 1),
            persistent=True,
        )

    validate(sched(True))
    with pytest.raises(
        ScheduleError,
        match=r"task #1 op1/main\[0\] of step e\+1 is not ordered after all of step e's "
        r"increments of its own counter 1 \(c1\)",
    ):
        validate(sched(False))
    r = simulate(sched(False), steps=2, workers=2, stall=1)
    assert any("increments counter 1 (c1) at 0, outside its step's range [1, 2)" in x for x in r.counter_errors)
