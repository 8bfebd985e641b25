"""Gaps a mutation audit of ``engine/distributed_llm.py`` found in what ``DistributedLLM`` hands on: the
arguments of ``build_worker`` (backend, seed, chunks, overlap, exchange, graphs in their places), the
backend, prefill chunk and batch invariance it keeps, no ``TargetHead`` without DSpark, ``rebalance``'s
replica count, and ``close`` / the ``with`` block telling the other ranks to stop. No process group: the
stand-in ``Comm`` of ``test_engine_mutation_gaps`` and a replaced ``build_worker``."""

from __future__ import annotations

import types

import pytest
import torch

from nonstop.dist.layout import Layout
from tests.dist.test_engine_mutation_gaps import FakeComm


def _build(monkeypatch, **kwargs):
    import nonstop.engine.distributed_llm as module

    comm = FakeComm(Layout.make(1, 2))
    calls = []
    worker = types.SimpleNamespace(
        comm=comm,
        executor=types.SimpleNamespace(backend="superop"),
        handle=lambda msg: ({"redundant": msg.T}, {}),
        dtype=torch.float32,
    )

    def build_worker(*args, **kw):
        calls.append((args, kw))
        return worker

    monkeypatch.setattr(module, "build_worker", build_worker)
    llm = module.DistributedLLM("k3-nano", dtype="float32", comm=comm, preflight=False, **kwargs)
    return llm, comm, calls


def test_the_rank_worker_gets_every_option_in_its_place(monkeypatch):
    """seed 5, backend superop, chunks 3, overlap True, exchange static, graphs False reach
    ``build_worker(comm, cfg, model_dir, dtype, backend, seed, chunks, overlap, progress, exchange,
    graphs)`` in that order. Catches two options swapped or one replaced by its default."""
    llm, comm, calls = _build(
        monkeypatch, backend="superop", seed=5, chunks=3, overlap=True, exchange="static", graphs=False
    )
    try:
        (args, kw) = calls[0]
        assert args[0] is comm and kw == {}
        assert args[3] == torch.float32
        assert args[4:] == ("superop", 5, 3, True, False, "static", False)
    finally:
        llm.close()


def test_the_llm_keeps_its_backend_prefill_chunk_and_batch_invariance(monkeypatch):
    """The LLM reports the rank executor's backend and keeps prefill_chunk 8 and batch_invariant True
    (the scheduler reads them). Without DSpark no target head is loaded. Catches any of them dropped."""
    llm, _, _ = _build(monkeypatch, prefill_chunk=8, batch_invariant=True, speculative={"method": "ngram"})
    try:
        assert llm.backend == "superop"
        assert llm.prefill_chunk == 8 and llm.batch_invariant is True
        assert llm.model is None and llm.drafter is not None
    finally:
        llm.close()


def test_rebalance_passes_the_replica_count_and_returns_the_placements(monkeypatch):
    """``rebalance(3)`` sends a rebalance of 3 replicas and returns rank 0's placements. Catches the count
    replaced by 0."""
    llm, comm, _ = _build(monkeypatch)
    try:
        assert llm.rebalance(3) == {"redundant": 3}
        assert [m.kind for m in comm.sent] == ["rebalance"] and comm.sent[0].T == 3
    finally:
        llm.close()


def test_close_and_the_with_block_stop_the_other_ranks_once(monkeypatch):
    """Leaving a ``with`` block closes: one "stop" goes to the other ranks; a second close sends nothing.
    Catches ``close`` or ``__exit__`` doing nothing (the other ranks would wait until the timeout)."""
    llm, comm, _ = _build(monkeypatch)
    with llm as same:
        assert same is llm
    assert [m.kind for m in comm.sent] == ["stop"]
    llm.close()
    assert [m.kind for m in comm.sent] == ["stop"]


@pytest.mark.parametrize(
    ("option", "error"),
    [
        ({"chunks": -1}, ValueError),
        ({"chunks": 0}, ValueError),
        ({"chunks": 2.5}, TypeError),
        ({"chunks": True}, TypeError),
        ({"overlap": "no"}, TypeError),
        ({"overlap": 1}, TypeError),
        ({"graphs": "no"}, ValueError),
        ({"graphs": 1}, ValueError),
    ],
)
def test_rank_options_are_refused_before_any_rank_loads(monkeypatch, option, error):
    """``chunks=-1`` or ``2.5`` was taken: every rank loaded its weights and the first MoE step failed on all of
    them with an internal error; ``chunks=0`` quietly became the default; ``overlap="no"`` (a truthy string)
    switched overlap on, and an unknown ``graphs`` string meant capture on. Each is now refused by rank 0
    before ``build_worker`` is called, naming the option."""
    with pytest.raises(error, match=next(iter(option))):
        _build(monkeypatch, **option)


def test_build_worker_refuses_the_same_rank_options_on_every_rank():
    """The other ranks build their worker from the launcher's arguments, not through DistributedLLM: the same
    check runs in ``build_worker`` before anything loads (a follower given chunks=-1 failed at its first step)."""
    from nonstop.engine.distributed import build_worker
    from tests.dist.test_engine_mutation_gaps import NANO

    comm = FakeComm(Layout.make(1, 2))
    with pytest.raises(ValueError, match="chunks must be an integer >= 1"):
        build_worker(comm, NANO, None, torch.float32, chunks=-1)
    with pytest.raises(TypeError, match="overlap must be True or False"):
        build_worker(comm, NANO, None, torch.float32, overlap="no")
