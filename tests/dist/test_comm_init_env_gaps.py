"""Gaps a second mutation audit of ``dist/comm.py`` found, checked in one process (the rendezvous and
torch.distributed's calls replaced): the defaults of an unset environment (a one-rank run with no RANK or
WORLD_SIZE), a zero timeout refused, a CUDA rank's device taken from LOCAL_RANK (not its global rank), and
the step broadcast's failure naming the right direction on rank 0 and on the others."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

import nonstop.dist.comm as comm_mod
from nonstop.dist.comm import Comm, RankFailure, env_int
from nonstop.dist.layout import Layout


def _no_join(monkeypatch, joined: list | None = None):
    seen = joined if joined is not None else []
    monkeypatch.setattr(comm_mod, "_join", lambda comm, world, *a: seen.append((comm.rank, world)))
    monkeypatch.setattr(comm_mod.dist.distributed_c10d, "_set_pg_timeout", lambda t, g: None)


def test_env_int_gives_the_default_when_the_variable_is_unset(monkeypatch):
    """Catches ``env_int`` answering 0 (not its default) for an unset variable: WORLD_SIZE unset must read
    as 1 and LOCAL_RANK unset as the global rank."""
    monkeypatch.delenv("NONSTOP_TEST_UNSET_INT", raising=False)
    assert env_int("NONSTOP_TEST_UNSET_INT", 7) == 7
    monkeypatch.setenv("NONSTOP_TEST_UNSET_INT", "3")
    assert env_int("NONSTOP_TEST_UNSET_INT", 7) == 3


@pytest.mark.timeout(30)
def test_a_one_rank_layout_joins_without_any_rank_variables(monkeypatch):
    """A world of one started by hand (no RANK, no WORLD_SIZE) is rank 0 of 1. Catches the unset
    WORLD_SIZE read as 0 (then "the layout needs 1 ranks ... but WORLD_SIZE is 0")."""
    joined: list = []
    _no_join(monkeypatch, joined)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    comm = comm_mod.init(Layout.make(1, 1), "cpu", 10.0, rendezvous=5.0)
    assert (comm.rank, comm.timeout, joined) == (0, 10.0, [(0, 1)])


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kw", [{"timeout": 0.0}, {"timeout": 10.0, "rendezvous": 0.0}])
def test_a_zero_second_timeout_is_refused_before_joining(monkeypatch, kw):
    """A collective timeout (or rendezvous) of 0 s fails every collective at once. Catches the lower bound
    of (0, TIMEOUT_MAX] made inclusive."""
    monkeypatch.setattr(comm_mod, "_join", lambda *a: pytest.fail("joined with a zero timeout"))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="must be a number of seconds in \\(0, "):
        comm_mod.init(Layout.make(1, 1), "cpu", **kw)


@pytest.mark.timeout(30)
def test_a_cuda_rank_uses_the_gpu_of_its_local_rank(monkeypatch):
    """Rank 3 of 4 on a second host of 2 GPUs has LOCAL_RANK 1: it must use cuda:1. Catches the device
    taken from the global rank (cuda:3: a GPU that host does not have)."""
    _no_join(monkeypatch)
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: chosen.append(dev))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    comm = comm_mod.init(Layout.make(1, 4), "cuda", 10.0, rendezvous=5.0)
    assert comm.device == torch.device("cuda", 1) and chosen == [torch.device("cuda", 1)]


@pytest.mark.parametrize(
    "rank, said",
    [(0, "sending the step to the other ranks"), (1, "receiving the next step from rank 0")],
)
def test_a_failed_step_broadcast_says_which_way_it_went(monkeypatch, rank, said):
    """Rank 0 sends the step, the others receive it: the failure line must say so. Catches the two
    directions swapped (rank 0 reporting it waited for a step from itself)."""

    def broken(*args, **kwargs):
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(dist, "broadcast_object_list", broken)
    comm = Comm(Layout.make(1, 2), rank, torch.device("cpu"), 30.0, control="control")
    with pytest.raises(RankFailure) as e:
        comm.broadcast_object({"kind": "step"})
    assert str(e.value).startswith(f"rank {rank}: {said} failed (Connection closed by peer)"), str(e.value)


@pytest.mark.timeout(30)
def test_a_rendezvous_that_ran_out_its_time_says_within(monkeypatch):
    """A rendezvous failing after 57 s of the 60 s allowed waited out its time (c10d's retries end a little
    early): the line says "within 60 s". Catches the 0.9 margin dropped ("after 57.0 s (of the 60 s
    allowed)", as if the ranks had been refused early)."""

    def timed_out(*args):
        raise RuntimeError("[c10d] timed out")

    clock = iter([100.0, 157.0])
    monkeypatch.setattr(comm_mod, "_join", timed_out)
    monkeypatch.setattr(comm_mod.time, "monotonic", lambda: next(clock))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RankFailure) as e:
        comm_mod.init(Layout.make(2, 1), "cpu", 10.0, rendezvous=60.0)
    assert "failed within 60 s (timed out)" in str(e.value), str(e.value)


def test_join_builds_no_one_rank_expert_groups(monkeypatch):
    """tp 2, ep 1, world 2: one attention group {0, 1} and two expert groups of one rank, which exchange
    nothing. Catches one-rank expert groups built (a group per rank every rank must create) and handed to
    the rank as if its experts were split."""
    made: list = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "new_group", lambda ranks, timeout=None, backend=None: made.append(tuple(ranks)) or 1)
    comm = Comm(Layout.make(2, 1, 2), 1, torch.device("cpu"), 30.0)
    comm_mod._join(comm, 2, "gloo", datetime.timedelta(seconds=60))
    assert comm.ep is None and comm.tp == 1 and made == [(0, 1)]


def test_join_enters_the_process_group_as_this_rank(monkeypatch):
    """Rank 1 of 2 must join the process group as rank 1 of world 2 with the rendezvous timeout. Catches
    every rank joining as rank 0 (two rank 0s: the rendezvous never completes)."""
    joined: list = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: joined.append((backend, kw)))
    monkeypatch.setattr(dist, "new_group", lambda ranks, timeout=None, backend=None: tuple(ranks))
    comm = Comm(Layout.make(1, 2), 1, torch.device("cpu"), 30.0)
    meet = datetime.timedelta(seconds=60)
    comm_mod._join(comm, 2, "gloo", meet)
    assert joined == [("gloo", {"init_method": "env://", "rank": 1, "world_size": 2, "timeout": meet})]
