"""Gaps a mutation audit of ``engine/distributed.py`` (rank 0's ``ClusterExecutor``) found, in one process
with the stand-in ``Comm`` of ``test_engine_mutation_gaps``: the hidden taps of a step put together from
rank 0's own group and another group's leader (``forward_hidden``, what a DSpark drafter reads under
``--world`` above 1), a cache-free scoring step (``forward`` with no cache), the step count, and
``rebalance`` on a model without routed experts and its return value."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from nonstop.cache.pages import PAGE_SIZE
from nonstop.dist.layout import Layout
from nonstop.engine.distributed import ClusterExecutor
from tests.dist.test_engine_mutation_gaps import NANO, FakeComm

V, D = 5, 4  # vocabulary and hidden size of the stand-in model


def _cluster(layout: Layout, handle, dtype=torch.float32, cfg=None):
    comm = FakeComm(layout)
    worker = SimpleNamespace(comm=comm, executor=SimpleNamespace(backend="reference"), handle=handle, dtype=dtype)
    return comm, ClusterExecutor(worker, cfg or SimpleNamespace(vocab_size=V, hidden_size=D))


def _filled(shape, offset: float, dtype=torch.float32) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float32) + offset).reshape(shape).to(dtype)


def test_hidden_taps_come_from_rank_0_and_the_other_groups_leader():
    """tp 1 x dp 2, slots 0, 1, 2 (rows 0 and 2 in group 0 on rank 0, row 1 in group 1 led by rank 1),
    T = 2, taps (3, 6), hidden states in bfloat16: rank 0's rows come from its own step; row 1 from rank
    1's logits [1, 2, V] (fp32) then its taps stacked [2, 1, 2, D] (bfloat16), tap 3 first. Catches the
    taps read from the wrong group or in the wrong order, the stacked shape's T, or the wrong dtype."""
    T, taps = 2, (3, 6)
    own_logits = _filled((2, T, V), 0.0)
    own_hidden = {3: _filled((2, T, D), 1000.0, torch.bfloat16), 6: _filled((2, T, D), 2000.0, torch.bfloat16)}
    seen = []

    def handle(msg):
        seen.append(msg)
        return own_logits.clone(), {t: h.clone() for t, h in own_hidden.items()}

    comm, ex = _cluster(Layout.make(1, 1, 2), handle, dtype=torch.bfloat16)
    try:
        other_logits = _filled((1, T, V), 100.0)
        other_hidden = torch.stack([_filled((1, T, D), 300.0), _filled((1, T, D), 600.0)]).to(torch.bfloat16)
        comm.inbox += [other_logits, other_hidden]
        cache = ex.new_cache(num_slots=3)
        ids = torch.tensor([[10, 11], [20, 21], [30, 31]])
        logits, hidden = ex.forward_hidden(ids, cache, cache.batch([0, 1, 2], T), taps)
        assert seen[0].taps == taps and not seen[0].last_only
        assert comm.sources == [1, 1]
        assert torch.equal(logits, torch.stack([own_logits[0], other_logits[0], own_logits[1]]))
        assert sorted(hidden) == [3, 6]
        for j, t in enumerate(taps):
            assert hidden[t].dtype == torch.bfloat16 and hidden[t].shape == (3, T, D)
            want = torch.stack([own_hidden[t][0], other_hidden[j][0], own_hidden[t][1]])
            assert torch.equal(hidden[t], want), t
        assert ex.stats["steps"] == 1
    finally:
        ex.close()


def test_last_only_from_another_group_receives_one_position():
    """A last-position step (``last_only``) of T = 3 over two groups: rank 0 receives [1, 1, V] from the
    other leader (its position 2 only) and returns [B, V]. Catches rank 0 expecting T positions from the
    other group (a shape mismatch on the wire) or returning [B, 1, V]."""
    own = _filled((1, 1, V), 0.0)
    comm, ex = _cluster(Layout.make(1, 1, 2), lambda msg: (own.clone(), {}))
    try:
        other = _filled((1, 1, V), 50.0)
        comm.inbox.append(other)
        cache = ex.new_cache(num_slots=2)
        got = ex.forward(torch.tensor([[1, 2, 3], [4, 5, 6]]), cache, cache.batch([0, 1], 3), last_only=True)
        assert got.shape == (2, V)
        assert torch.equal(got, torch.cat([own[:, 0], other[:, 0]]))
    finally:
        ex.close()


def test_cache_free_scoring_makes_a_temporary_cache_of_the_rows():
    """``forward(ids, None, None)`` (scoring without a cache): the step creates a cache of B slots on the
    ranks and scores rows 0..B-1 from position 0, all T positions. Catches a cache of the wrong size
    or a batch of the wrong length."""
    seen = []
    B, T = 3, 2

    def handle(msg):
        seen.append(msg)
        rows = len(msg.groups[0][0])
        return _filled((rows, T, V), 0.0), {}

    comm, ex = _cluster(Layout.make(1, 1, 1), handle)
    try:
        got = ex.forward(torch.tensor([[1, 2], [3, 4], [5, 6]]), None, None)
        msg = seen[0]
        assert msg.ops[0][0] == "new" and msg.ops[0][2:] == (B, PAGE_SIZE)
        assert msg.T == T and msg.groups == [([0, 1, 2], [0, 0, 0], [[1, 2], [3, 4], [5, 6]])]
        assert got.shape == (B, T, V)
    finally:
        ex.close()


def test_rebalance_needs_routed_experts_and_returns_the_placements():
    """A model without routed experts (llama) has nothing to rebalance: a clear ValueError before any
    message is sent. With experts, ``rebalance`` returns what rank 0's worker placed, for 0 extra replicas
    too. Catches the check inverted, 0 refused, and the placements dropped."""
    from nonstop.config import ModelConfig
    from tests.tiny_configs import LLAMA

    comm, ex = _cluster(Layout.make(1, 2), lambda msg: ({"placed": msg.T}, {}), cfg=ModelConfig.from_hf_dict(LLAMA))
    try:
        with pytest.raises(ValueError, match="without routed experts: nothing to rebalance"):
            ex.rebalance(0)
        assert comm.sent == []
    finally:
        ex.close()
    comm, ex = _cluster(Layout.make(1, 2), lambda msg: ({"placed": msg.T}, {}), cfg=NANO)
    try:
        assert ex.rebalance(0) == {"placed": 0}  # no extra replica: the lower bound itself
        assert ex.rebalance(2) == {"placed": 2}
    finally:
        ex.close()


@pytest.mark.parametrize("redundant", [1.5, "2", True, None])
def test_rebalance_refuses_a_replica_count_that_is_no_integer_before_any_rank_hears_of_it(redundant):
    """``rebalance(1.5)`` passed the range check and was sent to every rank, which all failed in
    ``ExpertPlacement.rebalanced`` (``range(1.5)``): the other ranks exited with a traceback and rank 0 was left
    with a bare TypeError, not knowing its cluster was gone. It is now refused on rank 0, with nothing sent."""
    comm, ex = _cluster(Layout.make(1, 2), lambda msg: ({"placed": msg.T}, {}), cfg=NANO)
    try:
        with pytest.raises(TypeError, match="redundant experts must be an integer"):
            ex.rebalance(redundant)
        assert comm.sent == [] and ex.failed is None
        assert ex.rebalance(np.int64(1)) == {"placed": 1}  # numpy's integers are integers
    finally:
        ex.close()
