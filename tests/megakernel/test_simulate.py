"""The simulator: many workers in seeded random interleavings over several steps, counters never reset,
give the results of sequential execution — for random synthetic schedules (checksum actions) and for
the schedules of every tiny family (plain-torch twins per tile, against the Program's reference)."""

from __future__ import annotations

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.program.lower import lower
from nonstop.runtime.megakernel import build_schedule, simulate, validate
from nonstop.runtime.megakernel.checksum import ChecksumActions
from nonstop.runtime.megakernel.sim_program import ProgramActions
from nonstop.runtime.megakernel.simulate import run_sequential
from nonstop.runtime.megakernel.steps import prepare_steps, reference_logits
from nonstop.runtime.megakernel.tilectx import TilingConfig
from tests.megakernel import mutations as mut
from tests.megakernel.synthetic import random_schedule
from tests.tiny_configs import TINY_CONFIGS

WORKERS = (1, 3, 16, 64)
STEPS = 3
CONFIG = TilingConfig(
    block_n=16,
    attn_split=4,
    max_context=16,
    attn_block_m=4,
    blocks=(("moe_experts", 8), ("kda_in_proj", 12), ("mla_in_proj", 12)),
)


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
    model = random_model(ModelConfig.from_hf_dict(TINY_CONFIGS[request.param]), torch.float32, seed=4)
    return model, lower(model)


def _run(model, program, s, workers, seed, steps=STEPS, B=2, T=2):
    st = prepare_steps(model, B, T, steps, seed=seed)
    actions = ProgramActions(s, program, st.cache, st.batches, st.ids[0], st.ids)
    result = simulate(
        s, steps, workers, seed=seed, actions=actions, bias=0.5 if workers > 1 else 0.0, slow_workers=0.25
    )
    return result, actions.end(steps), reference_logits(program, prepare_steps(model, B, T, steps, seed=seed))


@pytest.mark.parametrize("workers", WORKERS)
def test_program_schedule_matches_the_reference(family, workers):
    """Persistent: three steps back to back (each ends by writing the next step's ids), two sequences of
    two tokens (one starting fresh): every step's logits equal the ops run one by one."""
    model, program = family
    s = build_schedule(program, 2, 2, CONFIG, persistent=True)
    result, got, want = _run(model, program, s, workers, seed=workers)
    assert result.ok, result.summary()
    for e in range(STEPS):
        torch.testing.assert_close(got[e], want[e], rtol=1e-4, atol=1e-5, msg=lambda m: f"step {e}: {m}")


def test_split_counters_match_the_reference(family):
    model, program = family
    s = build_schedule(program, 2, 2, CONFIG, persistent=True, split_counters=True)
    result, got, want = _run(model, program, s, 16, seed=5)
    assert result.ok, result.summary()
    for e in range(STEPS):
        torch.testing.assert_close(got[e], want[e], rtol=1e-4, atol=1e-5)


def test_one_launch_per_step_matches_the_reference(family):
    model, program = family
    s = build_schedule(program, 2, 1, CONFIG, persistent=False)
    result, got, want = _run(model, program, s, 16, seed=7, T=1)
    assert result.ok, result.summary()
    for e in range(STEPS):
        torch.testing.assert_close(got[e], want[e], rtol=1e-4, atol=1e-5)


def test_a_deadlock_names_the_stuck_tasks():
    s = mut.war_schedule()
    cyclic = mut.add_wait(s, 0, s.tasks[2].counter)  # f waits on h, which waits (through g) on f
    r = simulate(cyclic, 2, 8)
    assert r.deadlock and "task #0 f/main[0] waits on counter 2 (h/main) at 0 < 1" in r.deadlock
    assert r.finished == 0


def test_tiles_declare_everything_they_read(family):
    """Each tile's twin, run with garbage everywhere outside its declared READ regions, writes exactly
    what it writes on the real state (so the validator's proof covers every real read); and the audit
    notices a read that a tile stops declaring."""
    model, program = family
    s = build_schedule(program, 3, 2, CONFIG, persistent=True)
    st = prepare_steps(model, 3, 2, 1)
    actions = ProgramActions(s, program, st.cache, st.batches, st.ids[0], st.ids)
    for i in range(len(s.tasks)):  # in queue order, so every tile sees its inputs ready
        assert actions.audit(i) is None
        actions.finish(i, 0, actions.start(i, 0))
    i = next(i for i, t in enumerate(s.tasks) if s.ops[t.op].kind == "linear_residual")
    assert s.tasks[i].regions[0].access == mut.Access.READ  # the o_proj input
    actions.s = mut.replace_task(s, i, regions=s.tasks[i].regions[1:])
    assert "depends on values outside the regions it declares to read" in actions.audit(i)
