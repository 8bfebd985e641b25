"""Deliberately broken schedules: the validator rejects each with a message naming the task and the
buffer or counter, and the simulator shows each hazard is real (a deadlock, a race the shadow counts
catch, or a counter overtaken) — the validator is not rejecting at random. Random wait deletions and
region changes on synthetic schedules must get the same verdict from both."""

from __future__ import annotations

import random

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.program.lower import lower
from nonstop.runtime.megakernel import ScheduleError, build_schedule, hunt, validate
from nonstop.runtime.megakernel.tilectx import TilingConfig
from tests.megakernel import mutations as mut
from tests.megakernel.synthetic import random_schedule
from tests.tiny_configs import KIMI_K3

CONFIG = TilingConfig(block_n=16, attn_split=4, max_context=16, attn_block_m=4)


@pytest.fixture(scope="module")
def k3():
    model = random_model(ModelConfig.from_hf_dict(KIMI_K3), torch.float32, seed=3)
    s = build_schedule(lower(model), B=2, T=1, config=CONFIG, persistent=True)
    validate(s)
    return s


def _kda(s):
    return (
        mut.tasks_of(s, "L0.kda_in_proj"),
        mut.tasks_of(s, "L0.kda_core"),
        mut.counter_of_op(s, "L0.kda_in_proj"),
        mut.counter_of_op(s, "L0.kda_core"),
    )


def missing_dependency(s):
    proj, core, c_proj, _ = _kda(s)
    return (
        mut.drop_wait(s, core[0], c_proj),
        r"read-after-write race on kda_\w+\[.*task #\d+ L0\.kda_core/main\[b0 h0\] reads it, but task #\d+ L0\.kda_in_proj/main\[.*\], which writes it, is not ordered before it",
        proj,
    )


def cycle(s):
    proj, core, _, c_core = _kda(s)
    return (
        mut.add_wait(s, proj[0], c_core),
        r"cycle of waits .*task #\d+ L0\.kda_\w+/main\[.*\] waits on counter \d+ \(L0\.kda_\w+/main\)",
        [],
    )


def double_write(s):
    proj, _, _, _ = _kda(s)
    q = s.buffer_index("kda_q")
    k = next(k for k, r in enumerate(s.tasks[proj[0]].regions) if r.buffer == q)
    return (
        mut.widen_region(s, proj[0], k, c1=s.buffers[q].cols),
        r"unordered write/write on kda_q\[.*L0\.kda_in_proj/main\[rows 16:32\] writes it and task #\d+ L0\.kda_in_proj/main\[rows 0:16\] writes it, but both increment",
        proj,
    )


def wrong_target(s):
    proj, core, c_proj, _ = _kda(s)
    P = s.counters[c_proj].per_step
    return (
        mut.change_wait(s, core[0], c_proj, base=P - 1),
        rf"task #\d+ L0\.kda_core/main\[b0 h0\] waits on counter \d+ \(L0\.kda_in_proj/main\) with target base {P - 1}: must be {P}",
        proj,
    )


def unsatisfiable_target(s):
    _, core, c_proj, _ = _kda(s)
    P = s.counters[c_proj].per_step
    return (
        mut.change_wait(s, core[0], c_proj, base=P + 1),
        r"L0\.kda_core/main\[b0 h0\] waits on counter \d+ \(L0\.kda_in_proj/main\) for \d+ increments, but only \d+ tasks increment it per step: the wait can never be satisfied",
        [],
    )


def epoch_scaling(s):
    proj, core, c_proj, _ = _kda(s)
    P = s.counters[c_proj].per_step
    N = len(s.tasks)
    return (
        mut.change_wait(s, core[0], c_proj, per_step=P - 1),
        rf"L0\.kda_core/main\[b0 h0\] waits on counter \d+ \(L0\.kda_in_proj/main\) with target e\*{P - 1}\+{P}, but .* grows by {P} per step: wrong epoch scaling",
        [N + i for i in proj],
    )


def wait_on_later_task(s):
    proj, core, _, _ = _kda(s)
    return (
        mut.move_before(s, core, proj[0]),
        r"task #\d+ L0\.kda_core/main\[b0 h0\] waits on counter \d+ \(L0\.kda_in_proj/main\), which task #\d+ L0\.kda_in_proj/main\[.*\] increments later in the queue",
        [],
    )


def never_incremented(s):
    _, core, _, _ = _kda(s)
    return (
        mut.add_orphan_counter(s, core[0]),
        r"task #\d+ L0\.kda_core/main\[b0 h0\] waits on counter \d+ \(orphan\), which no task increments",
        [],
    )


def missing_cross_step_dependency(s):
    embed = mut.tasks_of(s, "embed")
    sample = mut.tasks_of(s, "next_ids")
    return (
        mut.drop_wait(s, embed[0], mut.counter_of_op(s, "next_ids")),
        r"read-after-write race on ids\[row 0.*task #0 embed/main\[row 0\] reads it, but task #\d+ next_ids/main\[row 0\], which writes it in the previous step, is not ordered before it",
        sample,
    )


def read_before_write(_):
    """h's wait on g (the reader of x) becomes a wait on f (x's writer): h's write can land before g reads."""
    s = mut.war_schedule()
    f, g = s.tasks[0].counter, s.tasks[1].counter
    return (
        mut.change_wait(s, 2, g, counter=f),
        r"write-after-read race on x\[row 0, cols 0:4\]: task #2 h/main\[0\] writes it, but task #1 g/main\[0\], which reads it, is not ordered before it",
        None,
    )


def accumulate_races_write(_):
    s = mut.accumulate_schedule()
    return (
        mut.drop_wait(s, 2, s.tasks[0].counter),
        r"write/accumulate race on x\[.*task #2 add/main\[1\] accumulates into it, but task #0 zero/main\[0\], which writes it, is not ordered before it",
        None,
    )


def step_overtaking(_):
    s = mut.append_schedule()
    return (
        mut.drop_wait(s, 0, s.tasks[0].counter),
        r"task #0 a/main\[0\] of step e\+1 is not ordered after all of step e's increments of its own counter 0 \(a/main\)",
        None,
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
    read_before_write,
    accumulate_races_write,
    step_overtaking,
]


def test_the_valid_schedule_shows_no_hazard(k3):
    proj, _, _, _ = _kda(k3)
    assert hunt(k3, steps=2, workers=16, tickets=proj + mut.tasks_of(k3, "next_ids"), seeds=2) is None


@pytest.mark.parametrize("case", CASES, ids=lambda f: f.__name__)
def test_broken_schedule_is_rejected_and_the_hazard_is_real(case, k3):
    broken, pattern, tickets = case(k3)
    with pytest.raises(ScheduleError, match=pattern):
        validate(broken)
    found = hunt(broken, steps=2, workers=16, tickets=tickets, seeds=2)
    assert found is not None, f"{case.__name__}: the simulator found no hazard"
    print(case.__name__, "->", found.summary()[:200])


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
