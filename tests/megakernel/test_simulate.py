"""The simulator: many workers in seeded random interleavings over several steps, counters never reset,
give the results of sequential execution - for random synthetic schedules (checksum actions) and for the
schedule the megakernel runs of every tiny family (plain-torch twins per tile, against the Program's
reference); the same step gives bit-identical logits in every interleaving (no order-dependent sums)."""

from __future__ import annotations

import pytest
import torch

from nonstop.runtime.megakernel import simulate, validate
from nonstop.runtime.megakernel.verify.checksum import ChecksumActions
from nonstop.runtime.megakernel.verify.simulate import run_sequential
from tests.megakernel import mutations as mut
from tests.megakernel.kernel_steps import kernel_step
from tests.megakernel.synthetic import random_schedule
from tests.tiny_configs import TINY_CONFIGS

WORKERS = (1, 3, 16, 64)
STEPS = 3


@pytest.mark.parametrize("seed", range(24))
def test_synthetic_schedules_match_sequential(seed):
    s = random_schedule(seed, n_ops=10, persistent=seed % 2 == 0)
    validate(s)
    want = ChecksumActions(s)
    run_sequential(s, STEPS, want)
    for workers in WORKERS:
        got = ChecksumActions(s)
        r = simulate(
            s,
            STEPS,
            workers,
            seed=seed * 10 + workers,
            actions=got,
            bias=(0.0, 0.5, 0.9)[seed % 3],
            slow_workers=0.3 * (seed % 2),
        )
        assert r.ok, r.summary()
        assert got.values == want.values
        assert all((got.buffers[k] == v).all() for k, v in want.buffers.items())
        assert r.counters == [STEPS * c.per_step for c in s.counters]


@pytest.fixture(scope="module", params=list(TINY_CONFIGS))
def family(request):
    return kernel_step(request.param, B=2, T=2, steps=STEPS, seed=1)


def _run(ks, workers, seed):
    actions = ks.actions()
    result = simulate(
        ks.schedule, STEPS, workers, seed=seed, actions=actions, bias=0.5 if workers > 1 else 0.0, slow_workers=0.25
    )
    return result, actions.end(STEPS)


def test_kernel_schedule_matches_the_reference(family):
    """Three steps back to back (each ends with ``advance`` writing the next step's ids), two sequences of
    two tokens (one starting fresh), 1 to 64 workers: every step's logits equal the ops run one by one;
    and every interleaving gives the same logits bit for bit (the step is deterministic)."""
    want = family.reference()
    first = None
    for workers in WORKERS:
        result, got = _run(family, workers, seed=workers)
        assert result.ok, result.summary()
        for e in range(STEPS):
            torch.testing.assert_close(got[e], want[e], rtol=1e-4, atol=1e-5, msg=lambda m, e=e: f"step {e}: {m}")
        if first is None:
            first = got
        for e in range(STEPS):
            assert torch.equal(got[e], first[e]), f"{workers} workers: step {e} differs from another interleaving"


def test_a_deadlock_names_the_stuck_tasks():
    s = mut.war_schedule()
    cyclic = mut.add_wait(s, 0, s.tasks[2].counter)  # f waits on h, which waits (through g) on f
    r = simulate(cyclic, 2, 8)
    assert r.deadlock and "task #0 f/main[0] waits on counter 2 (h/main) at 0 < 1" in r.deadlock
    assert r.finished == 0


def test_tiles_declare_everything_they_read(family):
    """Each tile's twin, run with garbage everywhere outside its declared READ regions, writes exactly what it
    writes on the real state (so the validator's proof covers every real read); and the audit notices a
    read that a tile stops declaring."""
    s = family.schedule
    actions = family.actions()
    for i in range(len(s.tasks)):  # in queue order, so every tile sees its inputs ready
        assert actions.audit(i) is None
        actions.finish(i, 0, actions.start(i, 0))
    i = next(i for i, t in enumerate(s.tasks) if s.ops[t.op].kind == "lm_head")
    assert s.tasks[i].regions[0].access == mut.Access.READ  # the head's input
    actions.s = mut.replace_task(s, i, regions=s.tasks[i].regions[1:])
    assert "depends on values outside the regions it declares to read" in actions.audit(i)
