"""Mutation-audit gaps of the static schedule validator (``verify/validate.py``) and the frontier it sweeps
(``frontier.py``): each test builds a hand-made schedule whose verdict is worked out by hand from the protocol
in ``tasks.py`` (a wait's target, which accesses conflict), and checks the validator's verdict."""

from __future__ import annotations

import pytest

from nonstop.runtime.megakernel import ScheduleError, simulate, validate
from nonstop.runtime.megakernel.tasks import Access
from tests.megakernel.hand_schedule import X, Y, Z
from tests.megakernel.hand_schedule import region as _w
from tests.megakernel.hand_schedule import sched as _sched
from tests.megakernel.hand_schedule import task as _t


def test_a_three_counter_wait_cycle_is_reported_in_wait_order():
    """Counters 0 -> 1 -> 2 -> 0 (task 0 waits on task 2, task 1 on task 0, task 2 on task 1): a cycle of three,
    so its direction matters. The witness must follow the waits: each named task waits on the next counter,
    which the task named after it increments (a reversed walk would name waits that do not exist)."""
    s = _sched(
        [X, Y, Z],
        [
            _t(0, [_w(2, Access.READ), _w(0, Access.WRITE)], 0, [(2, 1, 1)]),
            _t(1, [_w(0, Access.READ), _w(1, Access.WRITE)], 1, [(0, 1, 1)]),
            _t(2, [_w(1, Access.READ), _w(2, Access.WRITE)], 2, [(1, 1, 1)]),
        ],
        (1, 1, 1),
    )
    with pytest.raises(ScheduleError) as exc:
        validate(s)
    msg = str(exc.value)
    assert msg.startswith("cycle of waits (deadlock in every interleaving): ")
    pairs = {
        ("#1", "0"): "#0",  # task 1 waits on counter 0, incremented by task 0
        ("#2", "1"): "#1",
        ("#0", "2"): "#2",
    }
    parts = msg.split(": ", 1)[1].split("; ")
    assert len(parts) == 3
    for part in parts:
        waiter = part.split()[1]
        counter = part.split("waits on counter ")[1].split()[0]
        assert (waiter, counter) in pairs, part
        assert f"incremented by task {pairs[waiter, counter]} " in part
    assert simulate(s, steps=1, workers=3).deadlock is not None


def test_bias_drives_the_highest_ticket_ahead_so_a_missing_wait_shows_at_once():
    """x = f(); y = g(x) with g's wait on f deleted. With bias 1 the simulator always moves the worker with the
    highest ticket (an idle worker counts as holding the next ticket): both tickets are handed out, then g (ticket
    1) starts before f (ticket 0) has written x, a read-after-write race, whatever the seed. Moving the lowest
    ticket instead would run f to completion first and hide the race."""
    s = _sched(
        [X, Y],
        [_t(0, [_w(0, Access.WRITE)], 0), _t(1, [_w(0, Access.READ), _w(1, Access.WRITE)], 1)],
        (1, 1),
    )
    for seed in range(4):
        r = simulate(s, steps=1, workers=2, seed=seed, bias=1.0)
        assert r.races and "task #1 op1/main[0] read it before a write of it" in r.races[0], r.summary()
    # control: with the wait, the same driving finds nothing
    ok = _sched(
        [X, Y],
        [_t(0, [_w(0, Access.WRITE)], 0), _t(1, [_w(0, Access.READ), _w(1, Access.WRITE)], 1, [(0, 1, 1)])],
        (1, 1),
    )
    assert simulate(ok, steps=1, workers=2, bias=1.0).ok


def test_a_race_names_exactly_the_elements_of_the_unordered_write():
    """x is written in two halves by two counters (cols 0:2 by task 0, cols 2:4 by task 1); task 2 reads all of x
    but waits only on task 0. The unordered part is exactly cols 2:4 (task 1's half): the message must name
    that range, not a shifted or widened one."""
    s = _sched(
        [X, Y],
        [
            _t(0, [_w(0, Access.WRITE, 0, 2)], 0),
            _t(1, [_w(0, Access.WRITE, 2, 4)], 1),
            _t(2, [_w(0, Access.READ), _w(1, Access.WRITE)], 2, [(0, 1, 1)]),
        ],
        (1, 1, 1),
    )
    with pytest.raises(
        ScheduleError,
        match=r"^read-after-write race on x\[row 0, cols 2:4\]: task #2 op2/main\[0\] reads it, but task #1 "
        r"op1/main\[0\], which writes it",
    ):
        validate(s)
    s.tasks[2] = _t(2, [_w(0, Access.READ), _w(1, Access.WRITE)], 2, [(0, 1, 1), (1, 1, 1)])
    validate(s)
