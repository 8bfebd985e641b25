"""Hand-made schedules for the validator's ancestor sets (which counters' work a task is ordered after,
in its own step and in the previous one) and for its race messages. Correct schedules whose ordering
holds only through a chain of waits must be accepted (and the simulator must agree); broken ones must be
refused naming the right tasks. Every verdict is worked out by hand."""

from __future__ import annotations

import pytest

from nonstop.runtime.megakernel import ScheduleError, hunt, simulate, validate
from nonstop.runtime.megakernel.tasks import Access, BufferInfo
from tests.megakernel.hand_schedule import CACHE, W, X, Y, Z
from tests.megakernel.hand_schedule import region as _w
from tests.megakernel.hand_schedule import sched as _sched
from tests.megakernel.hand_schedule import task as _t

R, WR, ACC, PAST = Access.READ, Access.WRITE, Access.ACCUMULATE, Access.READ_PAST


def test_a_read_ordered_through_a_chain_of_three_waits_is_accepted():
    """x = f(); y = g(x); z = h(y); w = k(x, z): k waits only on h, h on g, g on f, so k's read of x is
    ordered after f's write through three waits. Dropping any link of the transitive closure would refuse
    this correct schedule."""
    s = _sched(
        [X, Y, Z, W],
        [
            _t(0, [_w(0, WR)], 0),
            _t(1, [_w(0, R), _w(1, WR)], 1, [(0, 1, 1)]),
            _t(2, [_w(1, R), _w(2, WR)], 2, [(1, 1, 1)]),
            _t(3, [_w(0, R), _w(2, R), _w(3, WR)], 3, [(2, 1, 1)]),
        ],
        (1, 1, 1, 1),
    )
    validate(s)
    assert hunt(s, steps=2, workers=4, seeds=2) is None


def test_a_wait_on_a_counter_covers_the_ancestors_of_each_of_its_tasks():
    """Counter 2 has two tasks: one after f (reads x), one after g (reads y). k waits for both of them, so
    it is ordered after f and g: its reads of x and y are safe (the ancestors of every task of the counter
    count, not only the last one's)."""
    s = _sched(
        [X, Y, Z],
        [
            _t(0, [_w(0, WR)], 0),
            _t(1, [_w(1, WR)], 1),
            _t(2, [_w(0, R)], 2, [(0, 1, 1)]),
            _t(2, [_w(1, R)], 2, [(1, 1, 1)], tile=1),
            _t(3, [_w(0, R), _w(1, R), _w(2, WR)], 3, [(2, 2, 2)]),
        ],
        (1, 1, 2, 1),
    )
    validate(s)
    assert hunt(s, steps=2, workers=4, seeds=2) is None


def test_a_previous_step_wait_covers_that_counters_same_step_ancestors():
    """Persistent x = f(); y = g(x); z = h(y). Step e+1's f waits on step e's h (base 0); h waited on g in its
    step, so f's overwrite of x follows g's read of it. g and h are chained to their previous step only
    through their same-step waits (g on f, h on g). Correct: must be accepted."""
    s = _sched(
        [X, Y, Z],
        [
            _t(0, [_w(0, WR)], 0, [(0, 0, 1), (2, 0, 1)]),
            _t(1, [_w(0, R), _w(1, WR)], 1, [(0, 1, 1)]),
            _t(2, [_w(1, R), _w(2, WR)], 2, [(1, 1, 1)]),
        ],
        (1, 1, 1),
        persistent=True,
    )
    validate(s)
    assert hunt(s, steps=3, workers=4, seeds=2) is None


def test_previous_step_ancestors_of_each_task_of_a_counter_count():
    """Persistent. p appends a cache row; counter 1 has two tasks writing halves of x, only the first of
    which waits on step e-1's p; k waits on both (base 2) and reads the previous steps' cache rows: it is
    ordered after step e-1's p through the first task only. Correct: must be accepted."""
    s = _sched(
        [CACHE, X],
        [
            _t(0, [_w(0, WR)], 0, [(0, 0, 1)]),
            _t(1, [_w(1, WR, 0, 2)], 1, [(0, 0, 1), (1, 0, 2), (2, 0, 1)]),
            _t(1, [_w(1, WR, 2, 4)], 1, [(1, 0, 2), (2, 0, 1)], tile=1),
            _t(2, [_w(1, R), _w(0, PAST)], 2, [(1, 2, 2), (2, 0, 1)]),
        ],
        (1, 2, 1),
        persistent=True,
    )
    validate(s)
    assert hunt(s, steps=3, workers=4, seeds=2) is None


@pytest.mark.parametrize("persistent", [False, True])
def test_a_wait_on_the_previous_step_does_not_order_a_same_step_read(persistent):
    """y = g(x) waits on f's counter with base 0 (the previous step's f) instead of base 1: its read of x is
    not ordered after this step's write. Refused as a read-after-write race; the simulator, with f stalled,
    shows the read before the write."""
    chain = [(0, 0, 1)] if persistent else []
    s = _sched(
        [X, Y],
        [
            _t(0, [_w(0, WR)], 0, chain),
            _t(1, [_w(0, R), _w(1, WR)], 1, [(0, 0, 1)] + ([(1, 0, 1)] if persistent else [])),
        ],
        (1, 1),
        persistent,
    )
    with pytest.raises(
        ScheduleError,
        match=r"^read-after-write race on x\[row 0, cols 0:4\]: task #1 op1/main\[0\] reads it, but task "
        r"#0 op0/main\[0\], which writes it, is not ordered before it",
    ):
        validate(s)
    r = simulate(s, steps=2, workers=2, stall=0)
    assert r.races == [
        "step 0: task #1 op1/main[0] read it before a write of it (earlier in the queue) finished: x[row 0, cols 0:1]"
    ]


def test_a_task_overwriting_its_own_previous_steps_output_unchained_is_named_as_a_previous_step_race():
    """Persistent, f writes x and waits on nothing: step e+1's f may write x before step e's f did. The
    message must call it a race with the previous step (not two tasks of one counter in one step)."""
    s = _sched([X], [_t(0, [_w(0, WR)], 0)], (1,), persistent=True)
    with pytest.raises(
        ScheduleError,
        match=r"^write/write race on x\[row 0, cols 0:4\]: task #0 op0/main\[0\] writes it, but task "
        r"#0 op0/main\[0\], which writes it in the previous step, is not ordered before it",
    ):
        validate(s)


def test_a_race_message_names_the_task_that_wrote_the_elements():
    """Counter 0 has two tasks writing x cols 0:2 and 2:4; g reads cols 2:4 without waiting. The message must
    name the second task (the one whose write touches 2:4), not its neighbour whose range ends at 2."""
    s = _sched(
        [X, Y],
        [
            _t(0, [_w(0, WR, 0, 2)], 0),
            _t(0, [_w(0, WR, 2, 4)], 0, tile=1),
            _t(1, [_w(0, R, 2, 4), _w(1, WR)], 1),
        ],
        (2, 1),
    )
    with pytest.raises(
        ScheduleError,
        match=r"^read-after-write race on x\[row 0, cols 2:4\]: task #2 op1/main\[0\] reads it, but task "
        r"#1 op0/main\[1\], which writes it, is not ordered before it",
    ):
        validate(s)


def test_an_accumulate_conflicting_with_a_read_is_named_by_its_order():
    """x = f(); y = g(x); x += h() with h not waiting on g: a write-after-read race (h's accumulate after g's
    read), not a write/accumulate one."""
    s = _sched(
        [X, Y],
        [
            _t(0, [_w(0, WR)], 0),
            _t(1, [_w(0, R), _w(1, WR)], 1, [(0, 1, 1)]),
            _t(2, [_w(0, ACC)], 2, [(0, 1, 1)]),
        ],
        (1, 1, 1),
    )
    with pytest.raises(
        ScheduleError,
        match=r"^write-after-read race on x\[row 0, cols 0:4\]: task #2 op2/main\[0\] accumulates into it, "
        r"but task #1 op1/main\[0\], which reads it, is not ordered before it",
    ):
        validate(s)


def test_a_same_step_read_in_the_second_checked_step_is_not_called_a_previous_step_race():
    """Persistent: p appends a cache row, q (waiting on p in its step) reads it and appends to another cache;
    neither is chained to its previous step. The same-step read is ordered, so the only fault is the epoch
    rule, which must be what is reported (not a race "in the previous step" on the step's own row)."""
    kv = BufferInfo("kv", 1, 4, kind="cache", append_only=True)
    s = _sched([CACHE, kv], [_t(0, [_w(0, WR)], 0), _t(1, [_w(0, R), _w(1, WR)], 1, [(0, 1, 1)])], (1, 1), True)
    with pytest.raises(
        ScheduleError,
        match=r"^task #0 op0/main\[0\] of step e\+1 is not ordered after all of step e's increments of its own "
        r"counter 0 \(c0\)",
    ):
        validate(s)
