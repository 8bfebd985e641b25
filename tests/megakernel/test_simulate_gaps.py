"""Hand-made schedules with exactly one hazard (or none), run through the host simulator: it must report
every race, deadlock and overtaken counter, with the tasks, counters and elements named. Every expected
event is worked out by hand from the ticket order that ``stall`` forces (the stalled ticket's worker moves
only when no other worker can)."""

from __future__ import annotations

import pytest

from nonstop.runtime.megakernel import ScheduleError, hunt, simulate, validate
from nonstop.runtime.megakernel.tasks import Access, Schedule
from tests.megakernel.hand_schedule import CACHE, X, Y, Z
from tests.megakernel.hand_schedule import region as _w
from tests.megakernel.hand_schedule import sched as _sched
from tests.megakernel.hand_schedule import task as _t


def _wait_on_the_next_task() -> Schedule:
    """Task 0 waits on task 1's counter (no shared data): one worker holding ticket 0 never reaches ticket 1."""
    return _sched(
        [X, Y],
        [_t(0, [_w(0, Access.WRITE)], 0, [(1, 1, 1)]), _t(1, [_w(1, Access.WRITE)], 1)],
        (1, 1),
    )


def test_hunt_tries_one_worker_first_to_find_a_ticket_order_deadlock():
    """The deadlock shows only with a single worker (any second worker runs task 1): ``hunt`` with its
    default 64 workers must still find it, through its one-worker run."""
    s = _wait_on_the_next_task()
    with pytest.raises(ScheduleError):
        validate(s)
    assert simulate(s, steps=3, workers=2).ok  # two workers hide it
    found = hunt(s, seeds=0)
    assert found is not None and found.workers == 1
    assert (
        found.deadlock
        == "no worker can move (next ticket 1): step 0 task #0 op0/main[0] waits on counter 1 (c1) at 0 < 1"
    )


def test_a_deadlock_report_names_only_the_unmet_waits():
    """Task 1 waits on counter 0 (met once task 0 ran) and on counter 2 (a later task): with one worker it is
    stuck, and the report must list only the unmet wait, with the counter's value and target."""
    s = _sched(
        [X, Y, Z],
        [
            _t(0, [_w(0, Access.WRITE)], 0),
            _t(1, [_w(0, Access.READ), _w(1, Access.WRITE)], 1, [(0, 1, 1), (2, 1, 1)]),
            _t(2, [_w(2, Access.WRITE)], 2),
        ],
        (1, 1, 1),
    )
    r = simulate(s, steps=1, workers=1)
    assert (
        r.deadlock == "no worker can move (next ticket 2): step 0 task #1 op1/main[0] waits on counter 2 (c2) at 0 < 1"
    )
    assert r.finished == 1 and r.counters == [1, 0, 0]


def _unchained_cache_append() -> Schedule:
    """Persistent: f writes x (chained to its previous step); g appends a cache row and waits on nothing, so
    step 1's g may increment counter 1 before step 0's g."""
    return _sched(
        [X, CACHE],
        [_t(0, [_w(0, Access.WRITE)], 0, [(0, 0, 1)]), _t(1, [_w(1, Access.WRITE)], 1)],
        (1, 1),
        persistent=True,
    )


def test_an_overtaken_counter_is_reported_from_both_sides_and_stops_the_run():
    """Tickets 0 f, 1 g (stalled), 2 f, 3 g: step 1's g increments counter 1 at 0 (below its step's range
    [1, 2)), then step 0's g at 1 (above [0, 1)). With ``stop_on_hazard`` the run stops at the first; without,
    both are reported."""
    s = _unchained_cache_append()
    first = "step 1: task #1 op1/main[0] increments counter 1 (c1) at 0, outside its step's range [1, 2)"
    second = "step 0: task #1 op1/main[0] increments counter 1 (c1) at 1, outside its step's range [0, 1)"
    r = simulate(s, steps=2, workers=2, stall=1)
    assert len(r.counter_errors) == 1 and r.counter_errors[0].startswith(first), r.counter_errors
    assert r.finished == 3 and r.hazard and not r.races
    r = simulate(s, steps=2, workers=2, stall=1, stop_on_hazard=False)
    assert [e[: len(first)] for e in r.counter_errors] == [first, second], r.counter_errors
    assert r.finished == 4 and r.counters == [2, 2]


def _write_write_across_steps(f_waits_for_h: bool) -> Schedule:
    """Persistent: f writes x, then h (after f) writes x again. Step e+1's f must wait for step e's h (h's
    counter, previous step: base 0); each task waits on its own counter's previous step."""
    f_waits = [(0, 0, 1)] + ([(1, 0, 1)] if f_waits_for_h else [])
    return _sched(
        [X],
        [_t(0, [_w(0, Access.WRITE)], 0, f_waits), _t(1, [_w(0, Access.WRITE)], 1, [(0, 1, 1), (1, 0, 1)])],
        (1, 1),
        persistent=True,
    )


def test_a_write_overtaking_the_previous_steps_write_is_a_race():
    """With h (ticket 1) stalled, step 1's f writes x when only step 0's f has (x's count is 1 of the 2 that
    the sequential order has by then): the simulator must report the write/write race in step 1."""
    validate(_write_write_across_steps(True))
    broken = _write_write_across_steps(False)
    with pytest.raises(ScheduleError, match="write/write race on x"):
        validate(broken)
    r = simulate(broken, steps=2, workers=2, stall=1)
    assert r.races == [
        "step 1: task #0 op0/main[0] modified it before an earlier write of it finished: x[row 0, cols 0:1]"
    ]
    assert simulate(_write_write_across_steps(True), steps=3, workers=2, stall=1).ok


def _accumulate_after_read(h_waits_for_g: bool) -> Schedule:
    """x = f(); y = g(x); x += h(): h's accumulate must wait for g's read of x."""
    h_waits = [(0, 1, 1)] + ([(1, 1, 1)] if h_waits_for_g else [])
    return _sched(
        [X, Y],
        [
            _t(0, [_w(0, Access.WRITE)], 0),
            _t(1, [_w(0, Access.READ), _w(1, Access.WRITE)], 1, [(0, 1, 1)]),
            _t(2, [_w(0, Access.ACCUMULATE)], 2, h_waits),
        ],
        (1, 1, 1),
    )


def test_an_accumulate_before_an_earlier_read_finished_is_a_race():
    """With g (ticket 1) stalled, h accumulates into x while g has not read it yet: a write-after-read race
    the simulator must report for the accumulate, as for a plain write."""
    validate(_accumulate_after_read(True))
    broken = _accumulate_after_read(False)
    with pytest.raises(ScheduleError, match="write-after-read race on x"):
        validate(broken)
    r = simulate(broken, steps=1, workers=2, stall=1)
    assert r.races == [
        "step 0: task #2 op2/main[0] modified it before an earlier reader of it finished: x[row 0, cols 0:1]"
    ]
    assert simulate(_accumulate_after_read(True), steps=2, workers=2, stall=1).ok


def test_a_cache_read_early_in_a_later_step_is_a_race():
    """Persistent: p appends the step's cache row, q reads it. q's wait on p has epoch scaling 0 (target 1 in
    every step), so from step 1 on it does not wait for its own step's p. With step 1's p (ticket 2) stalled,
    step 1's q reads the row before it is written: cache counts are per step, so step 0's write must not
    satisfy step 1's read."""
    s = _sched(
        [CACHE, X],
        [
            _t(0, [_w(0, Access.WRITE)], 0, [(0, 0, 1)]),
            _t(1, [_w(0, Access.READ), _w(1, Access.WRITE)], 1, [(0, 1, 0), (1, 0, 1)]),
        ],
        (1, 1),
        persistent=True,
    )
    with pytest.raises(ScheduleError, match="wrong epoch scaling"):
        validate(s)
    r = simulate(s, steps=2, workers=2, stall=2)
    assert r.races == [
        "step 1: task #1 op1/main[0] read it before a write of it (earlier in the queue) finished: "
        "cache[row 0, cols 0:1]"
    ]
