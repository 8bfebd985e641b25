"""Deliberately broken schedules: the validator rejects each with a message naming the task and the buffer or
counter, and the simulator shows each hazard is real (a deadlock, a race the shadow counts catch, or a
counter overtaken) - the validator is not rejecting at random. The cases break the schedule the megakernel
runs, for every tiny family; random wait deletions and region changes on synthetic schedules, and random
wait deletions on the kernel's schedules, must get the same verdict from both (no false accepts)."""

from __future__ import annotations

import random

import pytest

from nonstop.runtime.megakernel import ScheduleError, hunt, validate
from tests.megakernel import mutations as mut
from tests.megakernel.kernel_steps import kernel_step
from tests.megakernel.synthetic import random_schedule
from tests.tiny_configs import TINY_CONFIGS


@pytest.fixture(scope="module", params=list(TINY_CONFIGS))
def family(request):
    s = kernel_step(request.param, B=2, T=1).schedule
    validate(s)
    return s


def _edge(s):
    """(consumer task, counter it waits on this step, that counter's tasks): the first same-step wait on a
    counter of two or more tasks whose consumer's own op has a later stage or op after it."""
    owners = s.tasks_of_counter()
    for i, t in enumerate(s.tasks):
        for w in t.waits:
            if w.base and len(owners[w.counter]) >= 2:
                return i, w.counter, owners[w.counter]
    raise AssertionError("no producer/consumer pair")


def _name(s, i) -> str:
    return s.task_name(i).split(" ", 1)[1].replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")


def missing_dependency(s):
    i, c, producers = _edge(s)
    return mut.drop_wait(s, i, c), rf"race on .*task #{i} {_name(s, i)} .* is not ordered before it", producers


def cycle(s):
    i, c, producers = _edge(s)
    return (
        mut.add_wait(s, producers[0], s.tasks[i].counter),
        r"cycle of waits \(deadlock in every interleaving\): task #\d+ .* waits on counter",
        [],
    )


def double_write(s):
    i, c, producers = _edge(s)
    p = producers[0]
    k = next(k for k, r in enumerate(s.tasks[p].regions) if r.access == mut.Access.WRITE)
    b = s.buffers[s.tasks[p].regions[k].buffer]
    broken = mut.widen_region(s, p, k, r0=0, r1=b.rows, c0=0, c1=b.cols)
    return broken, rf"unordered write/\w+ on {b.name}.*task #{p} {_name(s, p)} writes it.*but both increment", producers


def wrong_target(s):
    i, c, producers = _edge(s)
    P = s.counters[c].per_step
    return (
        mut.change_wait(s, i, c, base=P - 1),
        rf"task #{i} {_name(s, i)} waits on counter {c} .* with target base {P - 1}: must be {P}",
        producers,
    )


def unsatisfiable_target(s):
    i, c, _ = _edge(s)
    P = s.counters[c].per_step
    return (
        mut.change_wait(s, i, c, base=P + 1),
        rf"task #{i} {_name(s, i)} waits on counter {c} .* the wait can never be satisfied",
        [],
    )


def epoch_scaling(s):
    i, c, producers = _edge(s)
    P = s.counters[c].per_step
    N = len(s.tasks)
    return (
        mut.change_wait(s, i, c, per_step=P - 1),
        rf"waits on counter {c} .* grows by {P} per step: wrong epoch scaling",
        [N + p for p in producers],
    )


def wait_on_later_task(s):
    i, c, producers = _edge(s)
    return (
        mut.move_before(s, [i], producers[0]),
        rf"{_name(s, i)} waits on counter {c} .* increments later in the queue",
        [],
    )


def never_incremented(s):
    i, _, _ = _edge(s)
    return (
        mut.add_orphan_counter(s, i),
        rf"task #{i} {_name(s, i)} waits on counter \d+ \(orphan\), which no task increments",
        [],
    )


def missing_cross_step_dependency(s):
    """The embedding of step e+1 no longer waits for step e's ``advance``, which writes its token ids."""
    embed = mut.tasks_of(s, "embed")
    adv = mut.tasks_of(s, "advance")
    c = mut.counter_of_op(s, "advance")
    return (
        mut.drop_wait(s, embed[0], c),
        r"race on ids\[row 0.*task #0 embed/main\[row 0\] reads it, but task #\d+ advance/main\[seq 0\], which "
        r"writes it in the previous step",
        adv,
    )


CASES = [
    missing_dependency,
    cycle,
    double_write,
    wrong_target,
    unsatisfiable_target,
    epoch_scaling,
    wait_on_later_task,
    never_incremented,
    missing_cross_step_dependency,
]


def test_the_valid_schedule_shows_no_hazard(family):
    _, _, producers = _edge(family)
    assert hunt(family, steps=2, workers=16, tickets=producers + mut.tasks_of(family, "advance"), seeds=2) is None


@pytest.mark.parametrize("case", CASES, ids=lambda f: f.__name__)
def test_broken_schedule_is_rejected_and_the_hazard_is_real(case, family):
    broken, pattern, tickets = case(family)
    with pytest.raises(ScheduleError, match=pattern):
        validate(broken)
    found = hunt(broken, steps=2, workers=16, tickets=tickets, seeds=2)
    assert found is not None, f"{case.__name__}: the simulator found no hazard"


def test_random_wait_deletions_on_the_kernel_schedule_are_real_hazards(family):
    """Every wait the schedule derives is needed: deleting any one is rejected, and stalling the tasks of
    the counter it waited on shows the hazard."""
    rng = random.Random(len(family.tasks))
    waits = [(i, w.counter) for i, t in enumerate(family.tasks) for w in t.waits]
    owners = family.tasks_of_counter()
    N = len(family.tasks)
    for i, c in rng.sample(waits, min(6, len(waits))):
        broken = mut.drop_wait(family, i, c)
        with pytest.raises(ScheduleError):
            validate(broken)
        stalls = owners[c] + [N + p for p in owners[c]] + [i, N + i]
        assert hunt(broken, steps=3, workers=16, tickets=stalls, seeds=3) is not None, (family.task_name(i), c)


# ----------------------------------------------------------------------------- synthetic schedules


def read_before_write(_):
    """h's wait on g (the reader of x) becomes a wait on f (x's writer): h's write can land before g reads."""
    s = mut.war_schedule()
    f, g = s.tasks[0].counter, s.tasks[1].counter
    return (
        mut.change_wait(s, 2, g, counter=f),
        r"write-after-read race on x\[row 0, cols 0:4\]: task #2 h/main\[0\] writes it, but task #1 g/main\[0\], "
        r"which reads it, is not ordered before it",
    )


def accumulate_races_write(_):
    s = mut.accumulate_schedule()
    return (
        mut.drop_wait(s, 2, s.tasks[0].counter),
        r"write/accumulate race on x\[.*task #2 add/main\[1\] accumulates into it, but task #0 zero/main\[0\], which "
        r"writes it, is not ordered before it",
    )


def step_overtaking(_):
    s = mut.append_schedule()
    return (
        mut.drop_wait(s, 0, s.tasks[0].counter),
        r"task #0 a/main\[0\] of step e\+1 is not ordered after all of step e's increments of its own counter 0 "
        r"\(a/main\)",
    )


@pytest.mark.parametrize("case", [read_before_write, accumulate_races_write, step_overtaking], ids=lambda f: f.__name__)
def test_broken_synthetic_schedule_is_rejected_and_the_hazard_is_real(case):
    broken, pattern = case(None)
    with pytest.raises(ScheduleError, match=pattern):
        validate(broken)
    assert hunt(broken, steps=2, workers=16, seeds=2) is not None


def _verdicts(s) -> tuple[bool, bool]:
    try:
        validate(s)
        rejected = False
    except ScheduleError:
        rejected = True
    return rejected, hunt(s, steps=3, workers=64, seeds=0) is not None


def test_random_wait_deletions_get_the_same_verdict():
    """A deleted wait is rejected exactly when the simulator can show a hazard (no false accepts)."""
    rejected = 0
    for seed in range(60):
        s = random_schedule(seed, persistent=seed % 2 == 0)
        waits = [(i, w.counter) for i, t in enumerate(s.tasks) for w in t.waits]
        i, c = random.Random(seed).choice(waits)
        verdict = _verdicts(mut.drop_wait(s, i, c))
        assert verdict[0] == verdict[1], (seed, s.task_name(i), c, verdict)
        rejected += verdict[0]
    assert rejected >= 50


def test_random_region_changes_get_the_same_verdict():
    """A region grown to the whole buffer (or its access kind changed) is rejected exactly when it races."""
    counts = [0, 0]
    for seed in range(60):
        rng = random.Random(1000 + seed)
        s = random_schedule(seed, persistent=seed % 2 == 1)
        i = rng.randrange(len(s.tasks))
        k = rng.randrange(len(s.tasks[i].regions))
        r = s.tasks[i].regions[k]
        b = s.buffers[r.buffer]
        if r.access == mut.Access.READ_PAST or rng.random() < 0.5:
            broken = mut.widen_region(s, i, k, r0=0, r1=b.rows, c0=0, c1=b.cols)
        else:
            broken = mut.widen_region(
                s, i, k, access=rng.choice([mut.Access.READ, mut.Access.WRITE, mut.Access.ACCUMULATE])
            )
        verdict = _verdicts(broken)
        assert verdict[0] == verdict[1], (seed, broken.task_name(i), broken.tasks[i].regions[k], verdict)
        counts[verdict[0]] += 1
    assert min(counts) >= 10, counts
