"""Gaps a mutation audit of the megakernel's verification helpers found: the checksum actions' values must
tell tasks and steps apart (else a read of another task's or an earlier step's output goes unseen), the
schedule statistics printed for humans against hand counts, and ``verify.steps`` (the oracle's inputs)
against a whole-sequence forward of the model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from nonstop.runtime.megakernel import validate
from nonstop.runtime.megakernel.tasks import (
    Access,
    BufferInfo,
    Region,
    Schedule,
    Task,
    Wait,
    WeightSlice,
)
from nonstop.runtime.megakernel.verify.checksum import ChecksumActions
from nonstop.runtime.megakernel.verify.simulate import run_sequential
from nonstop.runtime.megakernel.verify.stats import format_stats, schedule_stats
from tests.megakernel.hand_schedule import X, Y, region, sched, task

# ----------------------------------------------------------------------------- checksum actions


def _two_writers() -> Schedule:
    """Task 0 writes x, task 1 writes y ([1, 4] each), neither reads: their values are their seeds."""
    return sched([X, Y], [task(i, [region(i, Access.WRITE)], i) for i in range(2)], [1, 1])


def test_checksum_values_differ_between_steps():
    """A task with no inputs must still write different values in different steps: otherwise a reader that
    saw the previous step's output (a missing cross-step wait) would compute the same checksum."""
    s = _two_writers()
    validate(s)
    one, two = ChecksumActions(s), ChecksumActions(s)
    run_sequential(s, 1, one)
    run_sequential(s, 2, two)
    assert one.values[(0, 0)] == two.values[(0, 0)] != two.values[(0, 1)]
    assert not np.array_equal(one.buffers[(0, -1)], two.buffers[(0, -1)])  # x after step 0 vs after step 1


def test_checksum_values_differ_between_tasks():
    """Two tasks with identical (empty) inputs in the same step write different values, so a task that read
    the wrong one's output would be noticed."""
    s = _two_writers()
    acts = ChecksumActions(s)
    run_sequential(s, 1, acts)
    assert acts.values[(0, 0)] != acts.values[(1, 0)]
    assert not np.array_equal(acts.buffers[(0, -1)], acts.buffers[(1, -1)])


# ----------------------------------------------------------------------------- statistics


def _stats_schedule() -> Schedule:
    """x = a(); y[:, :2] = b0(x), y[:, 2:] = b1() (b1 reads nothing, waits on nothing); z = c(y); w = d(y).
    Counters: d -> 0, b -> 1 (2 tasks), c -> 2, a -> 3 (the last counter is the shallowest).
    Weight bytes a 3000, b0 1000, b1 0, c 5000, d 2000."""
    bufs = [BufferInfo(n, 1, 4) for n in ("x", "y", "z", "w", "v")]  # v: unused

    def w(n):
        return (WeightSlice("w", 0, 0, 1, n),) if n else ()

    def reg(b, c0, c1, acc):
        return Region(b, 0, 1, c0, c1, acc)

    R, W = Access.READ, Access.WRITE
    tasks = [
        Task(0, 0, 0, 0, (reg(0, 0, 4, W),), 3, (), w(3000)),
        Task(1, 0, 0, 1, (reg(0, 0, 4, R), reg(1, 0, 2, W)), 1, (Wait(3, 1, 1),), w(1000)),
        Task(1, 0, 1, 1, (reg(1, 2, 4, W),), 1, ()),
        Task(2, 0, 0, 2, (reg(1, 0, 4, R), reg(2, 0, 4, W)), 2, (Wait(1, 2, 2),), w(5000)),
        Task(3, 0, 0, 3, (reg(1, 0, 4, R), reg(3, 0, 4, W)), 0, (Wait(1, 2, 2),), w(2000)),
    ]
    return sched(bufs, tasks, [1, 2, 1, 1], kinds=["gemv", "rows", "gemv", "norm"])


def test_schedule_stats_percentiles_and_depth_by_hand():
    """By hand: 5 tasks, 3 waits (max 1 a task, none on the previous step); depth 3 (a -> b0 -> c and d; b1 is
    level 1 but the counter b is done at level 2); sorted weight bytes [0, 1000, 2000, 3000, 5000] with
    nearest-rank percentiles p10 = 0, p50 = 2000, p90 = p99 = max = 5000."""
    s = _stats_schedule()
    validate(s)
    st = schedule_stats(s)
    assert (st["tasks"], st["ops"], st["counters"], st["buffers"]) == (5, 4, 4, 5)
    assert (st["waits"], st["waits_per_task_max"], st["previous_step_waits"]) == (
        3,
        1,
        0,
    )
    assert st["depth"] == 3
    assert st["weight_bytes_percentiles"] == {
        0: 0,
        10: 0,
        50: 2000,
        90: 5000,
        99: 5000,
        100: 5000,
    }
    assert st["weight_bytes"] == 11000 and st["tasks_without_weights"] == 1
    assert st["kinds"] == {
        "gemv": {"tasks": 2, "weight_bytes": 8000},
        "norm": {"tasks": 1, "weight_bytes": 2000},
        "rows": {"tasks": 2, "weight_bytes": 1000},
    }


def test_format_stats_prints_each_number_under_its_label():
    """The printed summary: every label followed by its own number (a p90 showing p99's value, the waits'
    max and previous-step counts swapped, or the streaming count inverted would mislead a reader)."""
    s = _stats_schedule()
    lines = format_stats(s).split("\n")
    assert lines[0] == "schedule: B=1 T=1 one launch per step"
    assert lines[1] == "tasks 5  ops 4  counters 4  buffers 5  depth 3 (tasks per level 1.7)"
    assert lines[2] == "waits 3 (max 1 per task, 0 on the previous step)"
    assert lines[3] == (
        "weight bytes 11,000; per task p0 0 p10 0 p50 2,000 p90 5,000 p99 5,000 max 5,000; 1 tasks stream none"
    )
    assert lines[4].split() == ["kind", "tasks", "weight", "bytes"]
    assert [line.split() for line in lines[5:]] == [
        ["gemv", "2", "8,000"],
        ["norm", "1", "2,000"],
        ["rows", "2", "1,000"],
    ]
    persistent = format_stats(dataclasses.replace(s, persistent=True)).split("\n")[0]
    assert persistent == "schedule: B=1 T=1 persistent (steps back to back)"


def test_format_stats_shows_p90_and_p99_under_their_own_labels():
    """Twenty tasks: 17 stream 1,000 bytes, two 2,000 and one 9,000. Nearest-rank p90 is the 18th smallest
    (2,000) and p99 the 20th (9,000): the printed p90 and p99 must differ accordingly."""
    sizes = [1000] * 17 + [2000, 2000, 9000]
    bufs = [BufferInfo("x", 1, 20)]
    tasks = [
        Task(
            0,
            0,
            k,
            0,
            (Region(0, 0, 1, k, k + 1, Access.WRITE),),
            0,
            (),
            (WeightSlice("w", 0, 0, 1, n),),
        )
        for k, n in enumerate(sizes)
    ]
    text = format_stats(sched(bufs, tasks, [20], kinds=["gemv"]))
    assert (
        "weight bytes 30,000; per task p0 1,000 p10 1,000 p50 1,000 p90 2,000 p99 9,000 max 9,000; "
        "0 tasks stream none" in text
    )


# ----------------------------------------------------------------------------- verify.steps


def test_prepared_steps_and_reference_logits_match_a_whole_sequence_forward():
    """``prepare_steps`` prefills prompts of 5, 3 and 7 tokens into slots 0, 1, 2; a B = 2 step batches slot 0
    and the fresh slot 3. Each step's reference logits (ops run one by one on the cached state) must equal a
    cache-free forward of the whole sequence so far (prompt + the teacher-forced ids of every step), and the
    steps' start positions advance by T = 2 a step."""
    from nonstop.runtime.megakernel.executor import MegakernelExecutor
    from nonstop.runtime.megakernel.verify.steps import prepare_steps, reference_logits
    from tests.runtime.helpers import tiny_model

    model = tiny_model("llama", seed=4)
    V, T = model.cfg.vocab_size, 2
    st = prepare_steps(model, B=2, T=T, steps=2, seed=3)
    assert st.slots == [0, 3] and st.T == T and len(st.ids) == 2
    assert [b.start.tolist() for b in st.batches] == [[5, 0], [7, 2]]
    assert [b.slots.tolist() for b in st.batches] == [[0, 3], [0, 3]]
    gen = torch.Generator().manual_seed(3)  # the prompts as prepare_steps draws them: slot order, lengths 5, 3, 7
    prompt0 = torch.randint(0, V, (1, 5), generator=gen)[0]
    logits = reference_logits(MegakernelExecutor(model, graphs=False).program, st)
    seqs = [prompt0, torch.zeros(0, dtype=torch.long)]
    for e, ids in enumerate(st.ids):
        assert ids.shape == (2 * T,) and ids.dtype == torch.long
        for b in range(2):
            seqs[b] = torch.cat([seqs[b], ids[b * T : (b + 1) * T]])
            with torch.no_grad():
                want = model(seqs[b][None])[0, -T:]
            torch.testing.assert_close(
                logits[e][b * T : (b + 1) * T],
                want,
                rtol=1e-4,
                atol=1e-4,
                msg=lambda m, e=e, b=b: f"step {e} seq {b}: {m}",
            )
    assert not torch.equal(st.ids[0], st.ids[1])  # every step feeds new tokens


def test_prepared_steps_prefill_every_prompt():
    """B = 3 batches slots 0 and 1 (prompts of 5 and 3 tokens, both prefilled) and the fresh slot 3; B = 4
    adds slot 2 (7 tokens): the first step starts each sequence after its prompt."""
    from nonstop.runtime.megakernel.verify.steps import prepare_steps
    from tests.runtime.helpers import tiny_model

    model = tiny_model("llama", seed=4)
    three = prepare_steps(model, B=3, T=1, steps=1)
    assert three.slots == [0, 1, 3] and three.batches[0].start.tolist() == [5, 3, 0]
    four = prepare_steps(model, B=4, T=1, steps=1)
    assert four.slots == [0, 1, 2, 3] and four.batches[0].start.tolist() == [5, 3, 7, 0]


def test_prepared_steps_refuse_more_sequences_than_prompts_plus_one():
    """B = 5 with three prompt lengths quietly made 4 sequences and failed later with a shape error in the
    kernel's slot copy; it is now a ValueError naming the limit (and B = 0 likewise)."""
    from nonstop.runtime.megakernel.verify.steps import prepare_steps
    from tests.runtime.helpers import tiny_model

    model = tiny_model("llama", seed=4)
    for B in (0, 5):
        with pytest.raises(ValueError, match=rf"B={B}: prepare_steps makes 1\.\.4 sequences"):
            prepare_steps(model, B=B, T=1, steps=1)
    assert prepare_steps(model, B=3, T=1, steps=1, prompt_lens=(2, 2)).slots == [0, 1, 2]


def test_weight_byte_percentiles_are_nearest_rank():
    """Ten tasks streaming 1..10 bytes: nearest rank gives p10 = 1 (the 1st), p50 = 5, p90 = 9 (the 9th),
    p99 = p100 = 10. The index int(q·n / 100) gave p90 = 10 (the maximum) and p50 = 6."""
    from nonstop.runtime.megakernel.verify.stats import _percentile

    values = list(range(1, 11))
    assert {q: _percentile(values, q) for q in (0, 10, 50, 90, 99, 100)} == {
        0: 1, 10: 1, 50: 5, 90: 9, 99: 10, 100: 10
    }  # fmt: skip
    assert _percentile([], 50) == 0 and _percentile([7], 0) == _percentile([7], 100) == 7
