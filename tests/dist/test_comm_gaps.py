"""Gaps a mutation audit of ``dist/comm.py`` found, checked in one process (``torch.distributed``'s calls
replaced by recorders): the bytes ``Comm.stats`` counts per collective (ring all-reduce 2(T-1)/T of the
tensor, a gather's non-leader part, the rows an all-to-all sends to *other* ranks, a step broadcast's
pickle to world - 1 ranks, a send), the gather's destination (the global rank of the group's leader),
the async all-to-all's guarded handle, ``guard`` turning a backend error into one ``RankFailure`` line,
``_backend``'s auto choice, and ``init`` / ``_join``: the rendezvous wait at least ``RENDEZVOUS_S``, the
collective timeout on every group, the control group (gloo over all ranks) and this rank's groups.
Expected values are hand arithmetic from the layout rules in ``dist/layout.py``'s docstring."""

from __future__ import annotations

import datetime
import pickle

import pytest
import torch
import torch.distributed as dist

from nonstop.dist import comm as comm_mod
from nonstop.dist.comm import Comm, RankFailure, _backend, _join
from nonstop.dist.layout import Layout

TP, EP, CONTROL = "tp-group", "ep-group", "control-group"


class Recorder:
    """Stands in for the torch.distributed calls ``Comm`` makes; records (name, kwargs)."""

    def __init__(self, monkeypatch, error: Exception | None = None):
        self.calls: list = []
        self.error = error
        for name in ("all_reduce", "gather", "all_to_all_single", "broadcast_object_list", "send", "recv"):
            monkeypatch.setattr(dist, name, self._make(name))

    def _make(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            if self.error is not None:
                raise self.error
            if kwargs.get("async_op"):
                return Work()
            return None

        return call


class Work:
    def __init__(self, error: Exception | None = None):
        self.error = error
        self.waited = False

    def wait(self):
        self.waited = True
        if self.error is not None:
            raise self.error


def _comm(tp: int, ep: int, world: int, rank: int) -> Comm:
    layout = Layout.make(tp, ep, world)
    return Comm(
        layout,
        rank,
        torch.device("cpu"),
        30.0,
        tp=TP if tp > 1 else None,
        ep=EP if ep > 1 else None,
        control=CONTROL,
    )


# ------------------------------------------------------------------ counted bytes


def test_an_all_reduce_counts_the_ring_bytes_of_its_attention_group(monkeypatch):
    """Catches the all-reduce counted over the world instead of the attention group (tp 4 of world 8:
    2 * 3/4 * 32 bytes = 48, not 2 * 7/8 * 32 = 56), and a sum run without an attention group."""
    rec = Recorder(monkeypatch)
    comm = _comm(4, 8, 8, 5)
    comm.all_reduce(torch.zeros(8, dtype=torch.float32))  # 32 bytes
    assert [c[0] for c in rec.calls] == ["all_reduce"] and rec.calls[0][2]["group"] == TP
    assert comm.stats["all_reduce"] == [1, 48.0]
    one = _comm(1, 2, 2, 1)  # --tp 1: no attention group, nothing to sum
    one.all_reduce(torch.zeros(8))
    assert len(rec.calls) == 1 and "all_reduce" not in one.stats


@pytest.mark.parametrize("rank, leader, sent", [(2, True, 0), (3, False, 4 * 6 * 2)])
def test_a_gather_goes_to_the_global_rank_of_the_groups_leader(monkeypatch, rank, leader, sent):
    """tp 2 on 4 ranks: ranks 2 and 3 are attention group 1, led by global rank 2. Catches the gather
    sent to rank 0 (outside the group), the leader counting its own part as sent (or a member not), and
    parts made on a member (only the leader receives)."""
    rec = Recorder(monkeypatch)
    comm = _comm(2, 1, 4, rank)
    t = torch.zeros(4, 6, dtype=torch.float16)  # 48 bytes
    parts = comm.gather_to_leader(t)
    (name, args, kwargs) = rec.calls[0]
    assert name == "gather" and kwargs["dst"] == 2 and kwargs["group"] == TP
    assert (parts is not None) is leader and (len(parts) == 2 if leader else True)
    assert comm.stats["gather"] == [1, sent]


def test_an_all_to_all_counts_only_the_rows_sent_to_other_ranks(monkeypatch):
    """ep 4, rank 6 is ep rank 2: of 3 + 1 + 5 + 2 rows it keeps 5 and sends 6, each row 3 x 2 fp32 =
    24 bytes: 144 bytes. Catches counting every row, or the kept rows of another rank's index."""
    rec = Recorder(monkeypatch)
    comm = _comm(1, 4, 8, 6)
    inp = torch.zeros(11, 3, 2)
    out = torch.zeros(11, 3, 2)
    handle = comm.all_to_all(out, inp, [1, 1, 1, 8], [3, 1, 5, 2], kind="a2a_dispatch")
    assert handle is None and rec.calls[0][2]["group"] == EP
    assert comm.stats["a2a_dispatch"] == [1, 6 * 24]


def test_an_async_all_to_all_returns_a_guarded_handle(monkeypatch):
    """Catches the async handle dropped (the caller's ``wait()`` then fails on None) and a failure in
    ``wait`` escaping as the backend's error instead of a ``RankFailure`` naming the exchange."""
    Recorder(monkeypatch)
    comm = _comm(1, 2, 2, 1)
    handle = comm.all_to_all(torch.zeros(2, 1), torch.zeros(2, 1), [1, 1], [1, 1], async_op=True, what="combine")
    assert handle is not None
    handle.wait()
    assert handle.work.waited
    handle.work = Work(RuntimeError("[../gloo/transport.cc:1] Connection closed by peer"))
    with pytest.raises(RankFailure, match=r"^rank 1: combine failed \(Connection closed by peer\)"):
        handle.wait()


def test_a_step_broadcast_counts_its_pickle_once_per_other_rank_on_rank_0_only(monkeypatch):
    """Catches the broadcast counted on a follower, or for every rank including the sender."""
    from nonstop.engine.distributed import StepMessage

    Recorder(monkeypatch)
    msg = StepMessage("step", groups=[None])
    root = _comm(1, 1, 3, 0)
    root.broadcast_object(msg)
    assert root.stats["broadcast"] == [1, 2 * len(pickle.dumps(msg))]
    follower = _comm(1, 1, 3, 2)
    follower.broadcast_object(msg)
    assert "broadcast" not in follower.stats
    root.broadcast_object(StepMessage("noop"))  # only steps are counted
    assert root.stats["broadcast"][0] == 1


def test_a_send_counts_its_bytes(monkeypatch):
    """Send goes on the control channel and counts the tensor's bytes."""
    rec = Recorder(monkeypatch)
    comm = _comm(2, 1, 4, 2)
    comm.send(torch.zeros(3, 5, dtype=torch.float32), 0)
    assert rec.calls[0][2]["group"] == CONTROL and comm.stats["send"] == [1, 60]


# ------------------------------------------------------------------ failures


def test_a_backend_error_becomes_one_line_naming_the_rank_and_the_collective(monkeypatch):
    """gloo's errors start with its source location, run over several lines and end in advice: the
    ``RankFailure`` keeps the first line's message only. Catches the location kept, the advice kept,
    another line taken, and RuntimeError (gloo's and NCCL's error type) let through unconverted."""
    error = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[127.0.0.1]:1234. This is typically caused by a rank exiting\nsecond line"
    )
    Recorder(monkeypatch, error)
    comm = _comm(1, 1, 2, 1)
    with pytest.raises(RankFailure) as info:
        comm.all_reduce_control(torch.zeros(1))
    assert str(info.value) == (
        "rank 1: summing over all ranks failed (Connection closed by peer [127.0.0.1]:1234); another rank has "
        "died, hung past the 30 s collective timeout, or failed"
    )


def test_the_auto_backend_is_gloo_on_cpu_and_nccl_on_cuda():
    """Catches the auto choice inverted and a named backend overridden."""
    assert _backend(torch.device("cpu"), "auto") == "gloo"
    assert _backend(torch.device("cuda", 0), "auto") == "nccl"
    assert _backend(torch.device("cpu"), "mpi") == "mpi"


# ------------------------------------------------------------------ joining


class Groups:
    """Stands in for ``dist.new_group`` (every rank calls it for every group, in order)."""

    def __init__(self, monkeypatch):
        self.made: list = []
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "new_group", self.new_group)

    def new_group(self, ranks, timeout=None, backend=None):
        self.made.append((tuple(ranks), backend, timeout))
        return ("group", tuple(ranks), backend)


@pytest.mark.parametrize("rank", [0, 3, 5])
def test_join_gives_each_rank_its_own_attention_and_expert_groups(monkeypatch, rank):
    """tp 2, ep 4, world 8: attention groups {0,1} {2,3} {4,5} {6,7}, expert groups {0..3} {4..7}; under
    gloo the control group is the world group. Catches a rank kept in another rank's group, a group
    dropped, and a gloo control group built anyway."""
    groups = Groups(monkeypatch)
    comm = Comm(Layout.make(2, 4, 8), rank, torch.device("cpu"), 30.0)
    meet = datetime.timedelta(seconds=60)
    _join(comm, 8, "gloo", meet)
    start = rank // 2 * 2
    assert comm.tp == ("group", (start, start + 1), None)
    first = rank // 4 * 4
    assert comm.ep == ("group", tuple(range(first, first + 4)), None)
    assert comm.control is dist.group.WORLD
    assert all(t == meet for _, _, t in groups.made) and len(groups.made) == 4 + 2


def test_join_under_nccl_builds_a_gloo_control_group_and_no_one_rank_groups(monkeypatch):
    """Catches the control channel (CPU step messages) left on NCCL, and one-rank groups built."""
    groups = Groups(monkeypatch)
    comm = Comm(Layout.make(1, 2, 2), 1, torch.device("cpu"), 30.0)
    _join(comm, 2, "nccl", datetime.timedelta(seconds=60))
    assert comm.control == ("group", (0, 1), "gloo")
    assert comm.tp is None and comm.ep == ("group", (0, 1), None)
    assert [g[0] for g in groups.made] == [(0, 1), (0, 1)]


@pytest.mark.parametrize("timeout, rendezvous, meet", [(5.0, None, 60.0), (300.0, None, 300.0), (5.0, 2.0, 2.0)])
def test_init_gives_the_rendezvous_its_time_and_every_group_the_collective_timeout(
    monkeypatch, timeout, rendezvous, meet
):
    """The ranks get max(timeout, RENDEZVOUS_S = 60) to meet unless told; every group then waits the
    collective timeout. Catches the rendezvous given only the collective timeout, an explicit rendezvous
    ignored, and the groups left with the rendezvous's wait (a dead rank noticed a minute late)."""
    seen = {}
    timeouts = []

    def join(comm, world, backend, wait):
        seen.update(world=world, backend=backend, wait=wait)
        comm.control, comm.ep = "control", "ep"

    monkeypatch.setattr(comm_mod, "_join", join)
    monkeypatch.setattr(dist.distributed_c10d, "_set_pg_timeout", lambda t, g: timeouts.append((t, g)))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    comm = comm_mod.init(Layout.make(1, 2), "cpu", timeout, rendezvous=rendezvous)
    assert comm.rank == 1 and comm.timeout == timeout
    assert seen == {"world": 2, "backend": "gloo", "wait": datetime.timedelta(seconds=meet)}
    assert {g for _, g in timeouts} == {dist.group.WORLD, "control", "ep"} - {None}
    assert all(t == datetime.timedelta(seconds=timeout) for t, _ in timeouts)


@pytest.mark.parametrize("world", ["1", "4"])
def test_init_refuses_a_world_size_other_than_the_layouts(monkeypatch, world):
    """Catches a WORLD_SIZE larger (or smaller) than the layout let through to the rendezvous."""
    monkeypatch.setattr(comm_mod, "_join", lambda *a: pytest.fail("joined"))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", world)
    with pytest.raises(ValueError, match=f"the layout needs 2 ranks .* but WORLD_SIZE is {world}"):
        comm_mod.init(Layout.make(1, 2), "cpu", 10.0)


def test_init_takes_a_timeout_of_exactly_timeout_max(monkeypatch):
    """``threading.TIMEOUT_MAX`` itself is a usable wait (the range is (0, TIMEOUT_MAX])."""
    import threading

    monkeypatch.setattr(comm_mod, "_join", lambda comm, *a: None)
    monkeypatch.setattr(dist.distributed_c10d, "_set_pg_timeout", lambda t, g: None)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    try:
        comm_mod.init(Layout.make(1, 1), "cpu", float(threading.TIMEOUT_MAX))
    except OverflowError:
        pytest.skip("this platform's timedelta cannot hold TIMEOUT_MAX")
