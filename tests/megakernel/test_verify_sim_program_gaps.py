"""Gaps a mutation audit of ``verify.sim_program`` / ``verify.twins`` found: the simulator's reuse of a stage
twin's run across the tiles of an op must stop when a region the tile reads changed in between (else a race
that changes a tile's input before it starts is hidden, and a broken kernel passes), and the split-KV twin
must give the softmax over the visible keys when a whole split has none."""

from __future__ import annotations

import pytest
import torch

from nonstop.runtime.megakernel.tasks import Access
from nonstop.runtime.megakernel.verify.twins import _merge, _split_partials
from tests.megakernel.kernel_steps import kernel_step


@pytest.fixture(scope="module")
def llama():
    return kernel_step("llama", B=2, T=2, steps=1, seed=1)


def _head_tiles(s):
    """Two lm_head tiles of one stage, and the activation region the second reads."""
    i, j = [k for k, t in enumerate(s.tasks) if s.ops[t.op].kind == "lm_head"][:2]
    assert (s.tasks[i].op, s.tasks[i].stage) == (s.tasks[j].op, s.tasks[j].stage)
    read = next(r for r in s.tasks[j].regions if r.access == Access.READ and s.buffers[r.buffer].kind == "activation")
    return i, j, read


def _run_until(acts, n):
    for k in range(n):
        acts.finish(k, 0, acts.start(k, 0))


def _bump(acts, region, writer):
    """A write (by task ``writer``) of the region's values + 1, as a racing task's finish stores it."""
    acts.finish(writer, 0, [(region, acts.gather(acts.env(0), region, 0) + 1.0)])


def test_a_tile_sees_its_inputs_as_they_are_when_it_starts(llama):
    """lm_head tile i starts (its twin runs), then the input both tiles read changes, then tile j starts: j's
    outputs must be those of a twin run on the changed input (as when the change came before i started), not
    the values i's run computed from the old input (which would hide the race)."""
    s = llama.schedule
    i, j, read = _head_tiles(s)

    stale = llama.actions()
    _run_until(stale, i)
    stale.start(i, 0)
    _bump(stale, read, i)
    got = stale.start(j, 0)

    fresh = llama.actions()
    _run_until(fresh, i)
    _bump(fresh, read, i)
    want = fresh.start(j, 0)

    unchanged = llama.actions()
    _run_until(unchanged, i)
    old = unchanged.start(j, 0)

    assert [r for r, _ in got] == [r for r, _ in want]
    assert not all(torch.equal(a, b) for (_, a), (_, b) in zip(want, old))  # the change matters
    for (r, a), (_, b) in zip(got, want):
        assert torch.equal(a, b), r


def test_a_tile_reuses_the_run_when_an_unchanged_value_is_stored(llama):
    """The same region stored again with the values it already holds (a new generation, equal contents): the
    tile's outputs are still right (the reuse check compares the values, not only the store counts)."""
    s = llama.schedule
    i, j, read = _head_tiles(s)
    acts = llama.actions()
    _run_until(acts, i)
    acts.start(i, 0)
    acts.finish(i, 0, [(read, acts.gather(acts.env(0), read, 0))])
    runs = acts.twin_runs
    got = acts.start(j, 0)
    assert acts.twin_runs == runs  # reused
    ref = llama.actions()
    _run_until(ref, i)
    for (_, a), (_, b) in zip(got, ref.start(j, 0)):
        assert torch.equal(a, b)


def test_split_kv_partials_with_an_empty_split_merge_to_the_softmax():
    """Sequence 0 sees keys 0..6, sequence 1 only keys 0..2: with splits of 2, sequence 1's splits 2 and 3 hold
    no visible key (max -inf). They must contribute nothing (not NaN) to the merged output."""
    gen = torch.Generator().manual_seed(1)
    B, T, H, S, D = 2, 1, 2, 7, 3
    scores = torch.randn(B, T, H, S, generator=gen) * 2
    values = torch.randn(B, S, H, D, generator=gen)
    visible = torch.ones(B, T, S, dtype=torch.bool)
    visible[1, :, 3:] = False
    got = _merge(_split_partials(scores, values, visible, split=2, NS=4))
    for b in range(B):
        for h in range(H):
            n = int(visible[b, 0].sum())
            p = torch.softmax(scores[b, 0, h, :n], dim=0)
            want = (p[:, None] * values[b, :n, h]).sum(0)
            torch.testing.assert_close(got[b, 0, h], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "tensor", "access"),
    [
        ("kimi_linear", "conv", Access.READ),  # the KDA input projection's conv window
        ("kimi_linear", "recurrent", Access.READ),  # the KDA core's recurrent state
        ("llama", "k", Access.READ_PAST),  # attention over the cached keys
        ("llama", "v", Access.READ_PAST),
    ],
)
def test_an_undeclared_cache_or_state_read_is_reported(name, tensor, access):
    """A tile that stops declaring its reads of a KDA state tensor or of the attention cache's earlier pages:
    the read-declaration audit must notice (the garbage it plants outside the declared reads has to cover the
    cache layers' storage, conv windows included, not only the activation buffers)."""
    from tests.megakernel import mutations as mut

    ks = kernel_step(name, B=2, T=2, steps=1, seed=1)
    s = ks.schedule

    def hit(r):
        b = s.buffers[r.buffer]
        return b.kind in ("cache", "state") and b.tensor == tensor and r.access == access

    i = next(i for i, t in enumerate(s.tasks) if any(hit(r) for r in t.regions))
    acts = ks.actions()
    _run_until(acts, i)
    assert acts.audit(i) is None
    acts.s = mut.replace_task(s, i, regions=tuple(r for r in s.tasks[i].regions if not hit(r)))
    assert "depends on values outside the regions it declares to read" in acts.audit(i)


def test_grouped_query_split_kv_twins_match_the_reference():
    """6 query heads in 2 KV groups (``LLAMA_GQA``), a 300-token sequence beside a fresh one, tiled for 8 SMs so
    attention splits the keys in two (the fresh sequence's second split sees no key): the simulated step's
    logits (split twins' partials, merged by the combine twins) equal the ops run one by one. Query head h
    must use KV head h // 3 (grouped), not h % 2."""
    import dataclasses

    from nonstop.config import ModelConfig
    from nonstop.kernels import platform
    from nonstop.runtime.megakernel import simulate
    from nonstop.runtime.megakernel.executor import MegakernelExecutor
    from nonstop.runtime.megakernel.kernel import step_schedule
    from nonstop.runtime.megakernel.verify.sim_program import ProgramActions
    from nonstop.runtime.megakernel.verify.steps import prepare_steps, reference_logits
    from nonstop.runtime.superop import ExecEnv
    from tests.runtime.helpers import random_model
    from tests.tiny_configs import LLAMA_GQA

    model = random_model(ModelConfig.from_hf_dict(LLAMA_GQA), torch.float32, seed=5)
    ex = MegakernelExecutor(model, graphs=False)
    B, T, lens = 2, 1, (300,)
    st = prepare_steps(model, B, T, 1, prompt_lens=lens)
    step = ex.static_step(B, T)
    step.slots.copy_(st.batches[0].slots)
    step.start.copy_(st.batches[0].start)
    ops = [*ex.program.ops, *ex.extra_ops]
    with platform.simulating(dataclasses.replace(platform.INTERPRETER, sms=8)):
        _, _, s, *_ = step_schedule(ex.program, ops, ex.impl, ExecEnv(step.buf, st.cache, step.batch), "cpu")
    assert {o.args["NS"] for o in s.ops if o.kind == "gqa_attn"} == {2}
    run = prepare_steps(model, B, T, 1, prompt_lens=lens)
    acts = ProgramActions(s, ex.program, ops, run.cache, run.batches, run.ids[0], run.ids)
    result = simulate(s, 1, 4, seed=0, actions=acts)
    assert result.ok, result.summary()
    want = reference_logits(ex.program, prepare_steps(model, B, T, 1, prompt_lens=lens))[0]
    torch.testing.assert_close(acts.end(1)[0], want, rtol=1e-4, atol=1e-5)


def test_every_tile_declares_its_reads_with_two_cached_sequences():
    """B = 3 (slots 0 and 1 hold 5 and 3 cached tokens, slot 3 is fresh): each tile's earlier-token reads of
    the attention cache are its own sequence's pages, so the read audit (which keeps exactly the declared
    reads, for sequence 1 its 3 cached tokens) finds every tile's outputs unchanged."""
    ks = kernel_step("llama", B=3, T=1, steps=1, seed=1)
    acts = ks.actions()
    for i in range(len(ks.schedule.tasks)):
        assert acts.audit(i) is None, i
        acts.finish(i, 0, acts.start(i, 0))


def test_a_cache_writer_changes_the_shared_cache_only_at_finish(llama):
    """The tile that writes the new tokens' keys: after its start (its twin has run) the shared cache still
    holds the old values - a reader racing it must see them - and after its finish, the tile's values."""
    s = llama.schedule
    i = next(
        i
        for i, t in enumerate(s.tasks)
        if any(r.access == Access.WRITE and s.buffers[r.buffer].kind == "cache" for r in t.regions)
    )
    acts = llama.actions()
    _run_until(acts, i)
    regions = [r for r in s.tasks[i].regions if r.access == Access.WRITE and s.buffers[r.buffer].kind == "cache"]
    before = [acts.gather(acts.env(0), r, 0) for r in regions]
    pending = acts.start(i, 0)
    for r, old in zip(regions, before):
        assert torch.equal(acts.gather(acts.env(0), r, 0), old)
    acts.finish(i, 0, pending)
    new = dict(pending)
    assert any(not torch.equal(new[r], old) for r, old in zip(regions, before))
    for r in regions:
        assert torch.equal(acts.gather(acts.env(0), r, 0), new[r])
