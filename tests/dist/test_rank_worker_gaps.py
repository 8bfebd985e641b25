"""Gaps a mutation audit of ``engine/distributed.py`` found: the rows of every attention group a rank's
executor is told about (``group_rows``: B x T of each group, 0 for a group without rows), which choose
the MoE exchange and size its static buffers identically on every rank of an expert group."""

from __future__ import annotations

import torch

from nonstop.dist.layout import Layout
from nonstop.engine.distributed import RankWorker, StepMessage
from tests.dist.test_engine_mutation_gaps import NANO, FakeComm


def test_a_prefill_step_tells_the_executor_every_groups_rows_times_t():
    """--world 3 (3 attention groups), a step of T = 4 positions: group 0 has 2 sequences (8 rows),
    group 1 none, group 2 one (4 rows). Catches the rows counted as sequences (T dropped)."""
    seen = []

    def run(ids, cache, batch, taps, group_rows):
        seen.append(("run", tuple(ids.shape), group_rows))
        return torch.zeros(ids.shape[0], ids.shape[1], 5), {}

    def idle(group_rows):
        seen.append(("idle", group_rows))

    layout = Layout.make(1, 1, 3)
    ops = [("new", 0, 6, 16)]
    groups = [([0, 1], [0, 0], [[1, 2, 3, 4], [5, 6, 7, 8]]), None, ([0], [0], [[9, 9, 9, 9]])]
    msg = StepMessage("step", ops, 0, groups, T=4)
    for rank in (0, 1):
        executor = type("E", (), {"local_cfg": NANO, "backend": "reference", "run": staticmethod(run)})()
        executor.idle = idle
        RankWorker(FakeComm(layout, rank), executor, torch.float32).handle(msg)
    assert seen == [("run", (2, 4), (8, 0, 4)), ("idle", (8, 0, 4))]


def test_another_groups_leader_sends_its_hidden_taps_after_its_logits():
    """DSpark under --world 2: rank 1 leads group 1 and must send rank 0 its logits, then the drafter's
    hidden taps stacked [taps, B, T, d]. Catches the taps left unsent (rank 0 then waits on them until
    the collective timeout)."""
    hidden = {1: torch.full((1, 2, 3), 1.0), 2: torch.full((1, 2, 3), 2.0)}

    def run(ids, cache, batch, taps, group_rows):
        return torch.zeros(1, 2, 5), {t: hidden[t] for t in taps}

    executor = type("E", (), {"local_cfg": NANO, "backend": "reference", "run": staticmethod(run)})()
    comm = FakeComm(Layout.make(1, 1, 2), 1)
    msg = StepMessage("step", [("new", 0, 2, 16)], 0, [None, ([0], [0], [[1, 2]])], T=2, taps=(1, 2))
    RankWorker(comm, executor, torch.float32).handle(msg)
    assert [dst for _, dst in comm.sends] == [0, 0]
    assert torch.equal(comm.sends[1][0], torch.stack([hidden[1], hidden[2]]))
