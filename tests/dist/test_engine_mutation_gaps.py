"""Gaps a mutation audit of ``engine/distributed.py`` found, without a process group (a stand-in ``Comm``):
the cache operations rank 0 logs replayed on every rank give each attention group's slots the cluster's
lengths (slot s in group s mod DP, local slot s div DP: hand-derived below), commit's checks, rank 0's
step put together from its own rows and another group's, ``last_only`` taking the last position, a
leader sending its logits to rank 0 (rank 0 itself sending nothing), the keep-alive's idle interval, a
failure remembered, a closed engine refusing steps, ``rebalance``'s bounds and the CLI's failure exit."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from nonstop.cache.pages import PAGE_SIZE
from nonstop.config import ModelConfig
from nonstop.dist.comm import RankFailure
from nonstop.dist.layout import Layout
from nonstop.engine.distributed import ClusterExecutor, RankWorker, StepMessage
from tests.dist.procs import ENV, ROOT

NANO = ModelConfig.from_file("nonstop/assets/k3-nano")
V = 5  # vocabulary of the stand-in logits


class FakeComm:
    """What the engine reads of a ``Comm``: the layout facts, the control channel (recorded), send / recv."""

    def __init__(self, layout: Layout, rank: int = 0, timeout: float = 60.0, fail=None):
        self.layout, self.rank, self.timeout, self.fail = layout, rank, timeout, fail
        self.device = torch.device("cpu")
        self.sent: list = []  # broadcast messages
        self.sends: list = []  # (tensor, dst)
        self.inbox: list = []  # tensors recv returns, in order
        self.sources: list = []  # the ranks recv was asked to receive from
        self.lock = threading.Lock()

    @property
    def dp_index(self) -> int:
        return self.layout.dp_index(self.rank)

    @property
    def leader(self) -> bool:
        return self.layout.tp_rank(self.rank) == 0

    def broadcast_object(self, msg=None, what=None):
        with self.lock:
            if self.fail is not None and self.fail(msg):
                raise RankFailure("rank 0: sending the step to the other ranks failed (gone)")
            self.sent.append(msg)
        return msg

    def send(self, t, dst):
        self.sends.append((t.clone(), dst))

    def recv(self, shape, dtype, src):
        self.sources.append(src)
        t = self.inbox.pop(0)
        assert tuple(t.shape) == tuple(shape) and t.dtype == dtype, (t.shape, shape)
        return t


def _worker(layout: Layout, rank: int, run=None) -> RankWorker:
    executor = SimpleNamespace(local_cfg=NANO, backend="reference", run=run, idle=lambda rows: None)
    return RankWorker(FakeComm(layout, rank), executor, torch.float32)


def _lengths(worker: RankWorker, cid: int) -> list[int]:
    return worker.caches[cid].lengths.tolist()


# ----------------------------------------------------------------------------- caches


def test_every_groups_caches_replay_the_clusters_operations():
    """DP 2, 5 slots: group 0 keeps slots 0, 2, 4 (local 0, 1, 2), group 1 slots 1, 3 (local 0, 1)."""
    layout = Layout.make(1, 1, 2)
    ex = ClusterExecutor(SimpleNamespace(comm=FakeComm(layout), executor=SimpleNamespace(backend="reference")), NANO)
    try:
        cache = ex.new_cache(num_slots=5, page_size=PAGE_SIZE)
        cache.advance(cache.batch([0, 1, 2, 3, 4], T=4))  # every slot 4 tokens
        cache.advance(cache.batch([1, 4], T=3))  # slots 1 and 4: 7
        cache.reset(2)  # slot 2: 0
        assert cache.lengths.tolist() == [4, 7, 0, 4, 7]
        ops = ex._take_log()
        groups = [_worker(layout, 0), _worker(layout, 1)]
        for w in groups:
            w.replay(ops)
        cid = cache.cache_id
        assert _lengths(groups[0], cid) == [4, 0, 7]
        assert _lengths(groups[1], cid) == [7, 4]
        del cache
        gc.collect()
        ops = ex._take_log()
        assert ops == [("drop", cid)]
        for w in groups:  # the cache gone on rank 0: dropped on every rank with the next message
            w.replay(ops)
            assert cid not in w.caches
    finally:
        ex.close()


def test_an_advance_by_per_row_counts_replays_on_every_group():
    """``ClusterCache.advance(batch, counts)``, the ``ModelCache`` interface it mirrors: every rank ends with
    rank 0's lengths (the replayed counts came as a list, and ``ModelCache.advance`` added it to a tensor)."""
    layout = Layout.make(1, 1, 2)
    ex = ClusterExecutor(SimpleNamespace(comm=FakeComm(layout), executor=SimpleNamespace(backend="reference")), NANO)
    try:
        cache = ex.new_cache(num_slots=3, page_size=PAGE_SIZE)
        cache.advance(cache.batch([0, 1, 2], T=4), counts=[1, 2, 4])
        assert cache.lengths.tolist() == [1, 2, 4]
        groups = [_worker(layout, 0), _worker(layout, 1)]
        ops = ex._take_log()
        for w in groups:
            w.replay(ops)
        assert _lengths(groups[0], cache.cache_id) == [1, 4]  # slots 0 and 2
        assert _lengths(groups[1], cache.cache_id) == [2]  # slot 1
    finally:
        ex.close()


def test_a_group_without_a_slot_still_keeps_one():
    layout = Layout.make(1, 1, 2)
    w = _worker(layout, 1)
    w.replay([("new", 7, 1, PAGE_SIZE)])  # one slot: group 0's
    assert w.caches[7].num_slots == 1


def test_commit_checks_its_counts_and_batch():
    layout = Layout.make(1, 1, 1)
    ex = ClusterExecutor(SimpleNamespace(comm=FakeComm(layout), executor=SimpleNamespace(backend="reference")), NANO)
    try:
        cache = ex.new_cache(num_slots=2)
        kept = cache.batch([0, 1], T=3, keep_states=True)
        for bad in ([0, 1], [1, 4]):
            with pytest.raises(ValueError, match=r"commit counts must be in 1\.\.3"):
                cache.commit(kept, bad)
        with pytest.raises(ValueError, match="keep_states=True"):
            cache.commit(cache.batch([0, 1], T=3), [1, 1])
        cache.commit(kept, [1, 3])
        assert cache.lengths.tolist() == [1, 3]
    finally:
        ex.close()


# ----------------------------------------------------------------------------- a step


def _logits(B: int, T: int, offset: float) -> torch.Tensor:
    return (torch.arange(B * T * V, dtype=torch.float32) + offset).reshape(B, T, V)


def test_a_leader_returns_the_last_position_and_rank_0_sends_nothing():
    layout = Layout.make(1, 1, 2)  # two groups of one rank: both lead their group
    full = _logits(2, 3, 0.0)
    for rank in (0, 1):
        w = _worker(layout, rank, run=lambda ids, cache, batch, taps, rows: (full[: ids.shape[0]].clone(), {}))
        groups = [([0], [0], [[1, 2, 3]]), ([0], [0], [[4, 5, 6]])]
        msg = StepMessage("step", [("new", 0, 2, PAGE_SIZE)], 0, groups, T=3, last_only=True)
        logits, _ = w.handle(msg)
        assert torch.equal(logits, full[:1, 2:3])  # position 2 of 0..2
        if rank == 0:
            assert w.comm.sends == []
        else:
            assert len(w.comm.sends) == 1 and w.comm.sends[0][1] == 0 and torch.equal(w.comm.sends[0][0], full[:1, 2:3])


def test_rank_0_puts_the_step_together_from_every_group():
    """TP 2 x DP 2 (world 4), slots 0, 1, 2: rows 0 and 2 are group 0's (local slots 0, 1), row 1 group 1's
    (local 0); rank 0 computes group 0's rows and receives group 1's from its leader, rank 2."""
    layout = Layout.make(2, 1, 4)
    comm = FakeComm(layout)
    own = _logits(2, 1, 0.0)
    other = _logits(1, 1, 100.0)
    seen = []

    def handle(msg):
        seen.append(msg)
        return own.clone(), {}

    worker = SimpleNamespace(comm=comm, executor=SimpleNamespace(backend="r"), handle=handle, dtype=torch.float32)
    ex = ClusterExecutor(worker, SimpleNamespace(vocab_size=V, hidden_size=4))
    try:
        cache = ex.new_cache(num_slots=3)
        batch = cache.batch([0, 1, 2], T=2)
        comm.inbox.append(other)
        ids = torch.tensor([[10, 11], [20, 21], [30, 31]])
        got = ex.forward(ids, cache, batch, last_only=True)
        msg = seen[0]
        assert msg.groups == [([0, 1], [0, 0], [[10, 11], [30, 31]]), ([0], [0], [[20, 21]])]
        assert msg.last_only and msg.T == 2 and comm.sent[0] is msg
        assert comm.sources == [2]
        assert torch.equal(got, torch.stack([own[0, 0], other[0, 0], own[1, 0]]))
    finally:
        ex.close()


# ----------------------------------------------------------------------------- keep-alive, failures, close


def _executor(comm: FakeComm, cfg=None, on_failure=None) -> ClusterExecutor:
    worker = SimpleNamespace(comm=comm, executor=SimpleNamespace(backend="reference"), handle=lambda m: ({}, {}))
    return ClusterExecutor(worker, cfg, on_failure)


def test_the_keepalive_waits_a_quarter_of_the_timeout_of_idleness():
    """timeout 8 s: a no-op once rank 0 has sent nothing for 2 s (checked every 0.5 s), not sooner."""
    comm = FakeComm(Layout.make(1, 2), timeout=8.0)
    t0 = time.monotonic()
    ex = _executor(comm)
    try:
        while not comm.sent and time.monotonic() - t0 < 20:
            time.sleep(0.05)
        first = time.monotonic() - t0
        assert comm.sent and comm.sent[0].kind == "noop"
        assert 1.9 <= first < 3.8, first
    finally:
        ex.close()


def test_a_step_counts_as_a_sign_of_life():
    """timeout 8 s: a step at about 1 s puts the first no-op 2 s after it, not 2 s after the start."""
    comm = FakeComm(Layout.make(1, 1, 1), timeout=8.0)
    worker = SimpleNamespace(comm=comm, executor=SimpleNamespace(backend="r"), dtype=torch.float32)
    worker.handle = lambda msg: (_logits(1, 1, 0.0), {})
    t0 = time.monotonic()
    ex = ClusterExecutor(worker, SimpleNamespace(vocab_size=V, hidden_size=4))
    try:
        cache = ex.new_cache(num_slots=1)
        time.sleep(1.0)
        ex.forward(torch.tensor([[1]]), cache, cache.batch([0], 1))
        stepped = time.monotonic() - t0
        while len(comm.sent) < 2 and time.monotonic() - t0 < 20:
            time.sleep(0.05)
        first = time.monotonic() - t0
        assert [m.kind for m in comm.sent] == ["step", "noop"]
        assert first >= stepped + 1.9, (stepped, first)
    finally:
        ex.close()


def test_a_failure_is_remembered_and_close_then_sends_nothing():
    comm = FakeComm(Layout.make(1, 2), fail=lambda msg: msg.kind == "step")
    told = []
    ex = _executor(comm, SimpleNamespace(vocab_size=V, hidden_size=4), told.append)
    try:
        cache = ex.new_cache(num_slots=1)
        with pytest.raises(RankFailure, match="sending the step"):
            ex.forward(torch.tensor([[1]]), cache, cache.batch([0], 1))
        assert told == ["rank 0: sending the step to the other ranks failed (gone)"]
        comm.fail = None  # the group is broken whatever the channel would do now
        with pytest.raises(RankFailure, match="sending the step"):
            ex.forward(torch.tensor([[1]]), cache, cache.batch([0], 1))
        assert comm.sent == []
    finally:
        ex.close()
    assert comm.sent == []  # no stop to a broken group


def test_a_failed_keepalive_is_remembered():
    comm = FakeComm(Layout.make(1, 2), timeout=2.0, fail=lambda msg: msg.kind == "noop")
    told = []
    ex = _executor(comm, SimpleNamespace(vocab_size=V, hidden_size=4), told.append)
    try:
        end = time.monotonic() + 20
        while not told and time.monotonic() < end:
            time.sleep(0.05)
        assert told, "the keep-alive never failed"
        cache = ex.new_cache(num_slots=1)
        with pytest.raises(RankFailure):
            ex.forward(torch.tensor([[1]]), cache, cache.batch([0], 1))
        assert comm.sent == []
    finally:
        ex.close()


def test_a_closed_engine_refuses_steps():
    comm = FakeComm(Layout.make(1, 2))
    ex = _executor(comm, SimpleNamespace(vocab_size=V, hidden_size=4))
    cache = ex.new_cache(num_slots=1)
    ex.close()
    with pytest.raises(RuntimeError, match="this engine is closed"):
        ex.forward(torch.tensor([[1]]), cache, cache.batch([0], 1))
    assert [m.kind for m in comm.sent] == ["stop"]


def test_rebalance_allows_one_replica_of_each_expert_per_rank():
    """8 experts over an expert group of 2: each may get one more replica, on the rank without it: 0..8."""
    comm = FakeComm(Layout.make(1, 2))
    ex = _executor(comm, NANO)
    try:
        for bad in (-1, 9):
            with pytest.raises(ValueError, match=r"redundant experts must be in 0\.\.8"):
                ex.rebalance(bad)
        assert comm.sent == []
        ex.rebalance(8)
        assert [m.kind for m in comm.sent] == ["rebalance"] and comm.sent[0].T == 8
    finally:
        ex.close()


def test_the_clis_failure_exit_is_one_line_and_status_3():
    code = "from nonstop.engine.distributed import print_failure_and_exit as f; f('rank 1: gone')"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and r.stderr == "nonstop: error: rank 1: gone\n", r.stderr
