"""Gaps a mutation audit of ``runtime/distributed.py`` found in ``RankExecutor`` itself, checked in one
process with a real ``Comm`` whose groups are unset (an attention group's all-reduce is then a no-op;
layouts without expert parallelism have no all-to-all): the rows of every attention group a step is
planned on when the caller does not say (each group as many rows as this one, 0 for an idle step), the
logits kept only on an attention group's first rank, the reason graphs are off under the dynamic
exchange, the first-steps launch count stopping after ``COUNTED_STEPS``, and ``set_placement``
restarting the per-expert load counts."""

from __future__ import annotations

import pytest
import torch

import nonstop.runtime.distributed as rd
from nonstop.cache.state import ModelCache, StepBatch
from nonstop.config import ModelConfig
from nonstop.dist.comm import Comm
from nonstop.dist.layout import Layout
from nonstop.dist.load import random_rank_state
from nonstop.dist.model import build_rank_model
from nonstop.runtime.cuda_graph import CapturedStep

NANO = ModelConfig.from_file("nonstop/assets/k3-nano")


class GatheringComm(Comm):
    """A ``Comm`` of an attention group of ``tp`` ranks whose gather hands the leader ``tp`` copies of its
    own part and every other rank nothing, as ``Comm.gather_to_leader`` does; its all-reduce sends
    nothing but is counted as one launch of the tensor's bytes."""

    def gather_to_leader(self, t):
        return [t] * self.layout.tp if self.leader else None

    def all_reduce(self, t):
        if self.layout.tp > 1:
            self.count("all_reduce", t.numel() * t.element_size())


def _executor(layout: Layout, rank: int = 0, **kwargs) -> rd.RankExecutor:
    comm = GatheringComm(layout, rank, torch.device("cpu"), 60.0)
    state = random_rank_state(NANO, layout, rank, torch.float32, "cpu", 0)
    return rd.RankExecutor(comm, NANO, build_rank_model(NANO, layout, rank, state), **kwargs)


def _step(ex: rd.RankExecutor, B: int = 2, T: int = 3, group_rows=None):
    cache = ModelCache(ex.local_cfg, B, capacity=64, dtype=torch.float32, device="cpu", page_size=16)
    batch = StepBatch(torch.arange(B), torch.zeros(B, dtype=torch.long), T)
    cache.pages.reserve_rows(batch.slots, batch.end)
    ids = torch.arange(1, B * T + 1).reshape(B, T)
    return ex.run(ids, cache, batch, group_rows=group_rows)


@pytest.fixture
def planned(monkeypatch):
    """The ``group_rows`` every exchange choice was made for, in order."""
    seen = []
    choose = rd.choose_exchange

    def recording(request, ops, group_rows, *rest):
        seen.append(tuple(group_rows))
        return choose(request, ops, group_rows, *rest)

    monkeypatch.setattr(rd, "choose_exchange", recording)
    return seen


def test_a_step_without_group_rows_gives_every_attention_group_this_groups_rows(planned):
    """--world 2 with tp 1 (two attention groups): a 2 x 3 step told nothing about the other group plans
    both groups at 6 rows (B x T). Catches the default naming this group only (a 1-tuple: every rank
    of an expert group must plan the same exchange over all groups)."""
    ex = _executor(Layout.make(1, 1, 2))
    logits, _ = _step(ex)
    assert planned == [(6, 6)]
    assert logits.shape == (2, 3, NANO.vocab_size)
    _step(ex, B=1, T=2, group_rows=(2, 5))  # given rows are used as they are
    assert planned[-1] == (2, 5)


def test_an_idle_step_without_group_rows_plans_zero_rows_for_every_group(planned):
    """``idle()`` with no rows named plans a step of 0 rows in each of the 2 attention groups. Catches a
    1-tuple (an exchange planned for a one-group layout)."""
    ex = _executor(Layout.make(1, 1, 2), rank=1)
    ex.idle()
    assert planned == [(0, 0)] and ex.stats["idle_steps"] == 1


def test_only_the_attention_groups_first_rank_returns_logits():
    """tp 2: rank 0 leads its attention group and returns the [B, T, V] logits; rank 1 returns None (its
    gather gives it nothing). Catches every rank returning the buffer's logits."""
    layout = Layout.make(2, 1, 2)
    lead, _ = _step(_executor(layout, rank=0), B=1, T=2)
    assert lead is not None and lead.shape == (1, 2, NANO.vocab_size)
    other, _ = _step(_executor(layout, rank=1), B=1, T=2)
    assert other is None


def test_graphs_are_off_for_the_dynamic_exchange_with_that_reason():
    """exchange=dynamic reads split sizes on the host: graphs off, saying so; exchange=static on a CPU is
    off because the device is not CUDA. Catches the two requests swapped."""
    layout = Layout.make(1, 2, 2)
    assert _executor(layout, exchange="dynamic").stats["graphs"] == (
        "off: the dynamic MoE exchange reads split sizes on the host"
    )
    assert _executor(layout, exchange="static").stats["graphs"] == "not a CUDA device"


def test_launch_counting_stops_after_counted_steps_when_counts_never_agree(monkeypatch):
    """The first eager steps of a shape run under a LaunchCounter until two counts agree, at most
    COUNTED_STEPS (3) of them. With counts that always differ, steps 4 and 5 run uncounted. Catches the
    budget never decreasing (every step counted: the counter's overhead forever)."""
    made = []

    class Counter:
        def __init__(self, device):
            made.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def tagged(self, kind):
            return self

        def summary(self):
            n = len(made)
            return {"launches": n, "host_syncs": 0, "host_syncs_by_kind": {}}

    monkeypatch.setattr(rd, "LaunchCounter", Counter)
    ex = _executor(Layout.make(1, 1, 2))
    for _ in range(5):
        _step(ex, B=1, T=1)
    assert len(made) == rd.COUNTED_STEPS == 3
    assert ex.stats["launches"]["1x1 dynamic"]["launches"] == 3


def test_set_placement_restarts_the_per_expert_load():
    """ep 2: after load was counted, ``set_placement`` (a rebalance) starts every MoE layer's count from
    zero. Catches the old counts kept (the next rebalance would weigh load routed under the old
    placement)."""
    layout = Layout.make(1, 2, 2)
    ex = _executor(layout)
    moe_ops = [op for op in ex.program.ops if op.kind == "moe_ep"]
    assert moe_ops
    for op in moe_ops:
        op.attrs["load"] = torch.arange(op.attrs["moe"].num_experts, dtype=torch.long) + 1
    assert all(int(v.sum()) > 0 for v in ex.expert_load().values())
    new = layout.with_placement(None)
    experts = random_rank_state(NANO, new, 0, torch.float32, "cpu", 0, only=lambda name: ".mlp.experts." in name)
    ex.set_placement(new, experts)
    loads = ex.expert_load()
    assert sorted(loads) == sorted(op.layer for op in moe_ops)
    for v in loads.values():
        assert v.shape == (NANO.moe.num_experts,) and int(v.abs().sum()) == 0
    assert ex.comm.layout is new


def _decode(ex: rd.RankExecutor, steps: int = 4, B: int = 2):
    """``steps`` decode steps of B sequences on one cache; the logits [steps, B, 1, V]."""
    cache = ModelCache(ex.local_cfg, B, capacity=64, dtype=torch.float32, device="cpu", page_size=16)
    out = []
    for i in range(steps):
        batch = StepBatch(torch.arange(B), torch.full((B,), i), 1)
        cache.pages.reserve_rows(batch.slots, batch.end)
        logits, _ = ex.run(torch.arange(B).reshape(B, 1) * 7 + i + 1, cache, batch)
        cache.advance(batch)
        out.append(logits)
    return torch.stack(out)


class RunningCapture(CapturedStep):
    """An emulated capture that runs the step's Python once, as a CUDA capture does (its collectives are
    recorded, not run, but ``Comm`` counts them as they are called)."""

    def capture(self, fn, signature):
        fn()
        super().capture(fn, signature)


@pytest.mark.parametrize("capture", ["emulated", "running"])
def test_an_emulated_captured_step_replays_with_the_eager_logits_and_collective_counts(capture, monkeypatch):
    """graphs="emulate" (the capture / replay logic without CUDA) on tp 2: decode steps of 2 sequences, then
    of 1 (a second shape, captured after counts exist), are captured once per shape and replayed 3 times
    each, give the eager run's logits, and ``Comm.stats`` counts each all-reduce once per step as the eager
    run does (a replay adds the captured step's counts by hand; a capture that runs the step's Python is
    not counted). Catches a replay that is not taken, and collective counts lost or doubled around
    capture / replay."""
    if capture == "running":
        make = rd.StaticStep
        monkeypatch.setattr(rd, "StaticStep", lambda *args: _with_running(make(*args)))
    layout = Layout.make(2, 1, 2)
    captured, eager = _executor(layout, graphs="emulate"), _executor(layout, graphs=False)
    for B in (2, 1):
        got, want = _decode(captured, B=B), _decode(eager, B=B)
        assert torch.equal(got, want)
    assert captured.stats["graph_captures"] == 2 and captured.stats["graph_replays"] == 6
    assert captured.stats["exchange_steps"] == {"static": 8, "dynamic": 0}
    per_step = eager.comm.stats["all_reduce"][0] // 8
    assert per_step > 0 and eager.comm.stats["all_reduce"][0] == 8 * per_step
    assert dict(captured.comm.stats) == dict(eager.comm.stats)


def _with_running(step):
    step.graph = RunningCapture(None, True)
    return step


def test_a_step_of_exactly_max_rows_runs_the_kernels():
    """A step of B x T = ``program.max_rows`` rows (16) is the largest the kernels take: it runs the
    kernel table, not the twins (the launch counts are named without " twins"); one row more runs the
    twins. Catches the boundary moved (a full-size step sent to the twins)."""
    ex = _executor(Layout.make(1, 1, 2))
    assert ex.program.max_rows == 16
    _step(ex, B=2, T=8)
    _step(ex, B=1, T=17)
    assert sorted(ex.stats["launches"]) == ["1x17 dynamic twins", "2x8 dynamic"]


def test_a_step_returns_the_hidden_taps_asked_for():
    """taps (3, 6) (a DSpark drafter's hidden states): the step returns {tap: [B, T, hidden]} for each, and
    nothing when no tap is asked for. Catches the taps dropped (the drafter would get no context)."""
    ex = _executor(Layout.make(1, 1, 2))
    cache = ModelCache(ex.local_cfg, 1, capacity=64, dtype=torch.float32, device="cpu", page_size=16)
    batch = StepBatch(torch.arange(1), torch.zeros(1, dtype=torch.long), 3)
    cache.pages.reserve_rows(batch.slots, batch.end)
    _, hidden = ex.run(torch.tensor([[1, 2, 3]]), cache, batch, taps=(3, 6))
    assert sorted(hidden) == [3, 6]
    assert all(h.shape == (1, 3, NANO.hidden_size) for h in hidden.values())
    assert not torch.equal(hidden[3], hidden[6])


def test_set_placement_plans_the_exchange_again(planned):
    """The exchange plans were made for the old placement: after ``set_placement`` the same step shape is
    planned again. Catches the kept plans (an exchange sized for the old placement's experts)."""
    layout = Layout.make(1, 2, 2)
    ex = _executor(layout)
    ex.exchange_mode((3, 3))
    ex.exchange_mode((3, 3))
    assert planned == [(3, 3)]  # kept per step shape
    new = layout.with_placement(None)
    experts = random_rank_state(NANO, new, 0, torch.float32, "cpu", 0, only=lambda name: ".mlp.experts." in name)
    ex.set_placement(new, experts)
    ex.exchange_mode((3, 3))
    assert planned == [(3, 3), (3, 3)]


def test_a_cpu_rank_exchanges_in_one_chunk_without_overlap_by_default():
    """``build_worker`` on a CPU with chunks and overlap left unset: every MoE exchange runs in 1 chunk,
    not overlapped (2 overlapped chunks are the CUDA default); given values are kept. Catches the CUDA
    defaults used on a CPU."""
    from nonstop.engine.distributed import build_worker

    class SeedComm(GatheringComm):
        def broadcast_object(self, obj=None, what=None):
            return obj  # rank 0's seed, as every rank receives it

    layout = Layout.make(1, 2, 2)
    for kwargs, want in (({}, (1, False)), ({"chunks": 3, "overlap": True}, (3, True))):
        comm = SeedComm(layout, 0, torch.device("cpu"), 60.0)
        worker = build_worker(comm, NANO, None, torch.float32, **kwargs)
        got = {(op.attrs["chunks"], op.attrs["overlap"]) for op in worker.executor.program.ops if op.kind == "moe_ep"}
        assert got == {want}


def test_the_executor_refuses_a_backend_or_exchange_it_cannot_run():
    """Building a rank's executor with the megakernel backend or an unknown exchange is refused with the
    layout's message, not run as something else. Catches the constructor skipping either check."""
    with pytest.raises(ValueError, match="backend 'megakernel' runs the whole step in one kernel on one device"):
        _executor(Layout.make(1, 1, 2), backend="megakernel")
    with pytest.raises(ValueError, match="unknown MoE exchange 'fast'"):
        _executor(Layout.make(1, 1, 2), exchange="fast")


def test_graphs_true_on_a_cpu_does_not_force_the_static_exchange():
    """graphs=True asks for captured steps, but a CPU has no CUDA graphs: nothing is captured, so the auto
    exchange is chosen as without graphs (dynamic: a layout with no token exchange). Catches the capture
    requirement applied although graphs are off (every step forced static for nothing)."""
    ex = _executor(Layout.make(1, 1, 2), graphs=True)
    assert ex.stats["graphs"] == "not a CUDA device"
    assert ex.exchange_mode((1, 1)) == "dynamic"
    assert ex.stats["exchange_steps"] == {"static": 0, "dynamic": 1}


def test_the_exchange_is_costed_on_a_hidden_row_of_the_executors_dtype(monkeypatch):
    """The auto choice weighs the bytes of one exchanged row: the routed experts' input, K3's latent of
    ``routed_expert_hidden_size`` values (k3-nano's config.json: 128) in the model's dtype: 128 x 4 bytes
    in fp32, 128 x 2 in bf16. Catches the width taken as 0 (the static padding then looks free)."""
    widths = []
    choose = rd.choose_exchange

    def recording(*args):
        widths.append(args[-1])
        return choose(*args)

    monkeypatch.setattr(rd, "choose_exchange", recording)
    layout = Layout.make(1, 2, 2)
    for dtype in (torch.float32, torch.bfloat16):
        comm = GatheringComm(layout, 0, torch.device("cpu"), 60.0)
        state = random_rank_state(NANO, layout, 0, dtype, "cpu", 0)
        rd.RankExecutor(comm, NANO, build_rank_model(NANO, layout, 0, state)).exchange_mode((2, 2))
    assert widths == [128 * 4, 128 * 2]


def test_set_placement_gives_a_rank_its_own_share_of_an_uneven_placement():
    """ep 2, rank 1, a new placement of 8 experts as 5 on rank 0 and 3 on rank 1: every MoE op of rank 1
    then holds 3 local experts (experts 5, 6, 7), out of 8 physical, its module sized for 3. Catches the
    share of another rank (rank 0's 5) taken."""
    from nonstop.dist.placement import ExpertPlacement

    layout = Layout.make(1, 2, 2)
    ex = _executor(layout, rank=1)
    new = layout.with_placement(ExpertPlacement(8, ((0, 1, 2, 3, 4), (5, 6, 7))))
    experts = random_rank_state(NANO, new, 1, torch.float32, "cpu", 0, only=lambda name: ".mlp.experts." in name)
    ex.set_placement(new, experts)
    moe_ops = [op for op in ex.program.ops if op.kind == "moe_ep"]
    assert moe_ops
    for op in moe_ops:
        a = op.attrs
        assert a["placement"].local(1) == (5, 6, 7)
        assert a["local_experts"] == 3 and a["experts"].num_experts == 3
        assert a["physical_experts"] == 8 and a["max_local"] == 5
        assert op.weights["w1"].shape[0] == 3
