"""Gaps a mutation audit of ``verify.audit`` found: ``audit_writes`` driven by a stand-in megakernel whose
"kernel" runs a Python action per task (no Triton), over hand-made storage where every mapping is known
by hand - a step of B = 2 sequences in slots 2 and 0 (starts 3 and 5), T = 2 tokens, an attention cache
whose pool row of (slot, position) is ``8 * slot + position``, a KDA state layer, one workspace.

Each test makes a task write one element its declarations do not cover (or only ones they do) and checks
the audit's verdict and the report's element, tensor and count."""

from __future__ import annotations

import types

import pytest
import torch

from nonstop.cache.state import KDAState
from nonstop.kernels import launch
from nonstop.runtime.megakernel.tasks import (
    Access,
    BufferInfo,
    Counter,
    OpTiles,
    Region,
    Schedule,
    StageSpec,
    Task,
    TileSpec,
)
from nonstop.runtime.megakernel.verify.audit import audit_writes

B, T, SLOTS, STARTS = 2, 2, [2, 0], [3, 5]
X, START, KCACHE, REC, WS, ROUTE = range(6)  # buffer indices
BUFFERS = [
    BufferInfo("x", 2, 3),
    BufferInfo("start", 2, 1, kind="step"),
    BufferInfo("k", B * T, 2, kind="cache", append_only=True, layer=0, tensor="k"),
    BufferInfo("recurrent", B, 4, kind="state", layer=1, tensor="recurrent"),
    BufferInfo("ws", 2, 3, kind="scratch"),
    BufferInfo("moe_experts.route", 2, 3, kind="scratch"),  # stands for the ids and p workspaces
]


class _Pages:
    @staticmethod
    def rows(slots, positions):
        return slots[:, None] * 8 + positions


class _Kernel:
    def __init__(self, actions):
        self.actions = actions

    def __getitem__(self, grid):
        return self

    def __call__(self, tasks_ptr, **_):
        self.actions[int(tasks_ptr[0, 0])]()


class _Megakernel:
    """What ``audit_writes`` uses of a ``StepKernel``: the schedule, one task row per task (column 0 is the
    task's index here), the launch of one task."""

    device = "cpu"

    def __init__(self, schedule, actions):
        self.options = {}
        self.schedule = schedule
        self.tasks = torch.arange(len(actions))[:, None].repeat(1, 7)
        self.prefetch = torch.zeros(len(actions), 1)
        self.kernel = _Kernel(actions)

    @staticmethod
    def arguments(**kwargs):
        return kwargs


def _env(keep_states=False):
    start = torch.tensor(STARTS)
    slots = torch.tensor(SLOTS)
    batch = types.SimpleNamespace(
        start=start,
        slots=slots,
        positions=start[:, None] + torch.arange(T),
        keep_states=keep_states,
    )
    kda = KDAState(3, 1, 2, 2, torch.float32, "cpu")  # recurrent [3, 1, 2, 2]: 4 values a slot
    if keep_states:
        kda.keep_recurrent(slots, torch.zeros(B, T, 1, 2, 2))  # history [3, T, 1, 2, 2]: token t at t*4 + c
    attn = types.SimpleNamespace(tensors={"k": torch.zeros(24, 2)}, pages=_Pages())
    cache = types.SimpleNamespace(layers=[attn, kda])
    return types.SimpleNamespace(buf={"x": torch.zeros(2, 3)}, batch=batch, cache=cache)


def _audit(monkeypatch, regions, action, keep_states=False, workspaces=None):
    """Problems of a one-task step (the task declares ``regions``, runs ``action(env, ws)``)."""
    ws = workspaces if workspaces is not None else {("ws", torch.float32): torch.zeros(6)}
    monkeypatch.setattr(launch, "_WORKSPACES", {(n, "cpu", dt): t for (n, dt), t in ws.items()})
    task = Task(0, 0, 0, 0, tuple(regions), 0, ())
    ops = [OpTiles("op", "op", None, [StageSpec("main", [TileSpec(0, task.regions)])])]
    s = Schedule(BUFFERS, ops, [Counter("c", 1)], [task], persistent=False, B=B, T=T)
    env = _env(keep_states)
    mk = _Megakernel(s, [lambda: action(env, launch._WORKSPACES)])
    return audit_writes(mk, env), env


def test_a_start_write_to_another_sequences_row_is_reported(monkeypatch):
    """``advance`` of sequence 0 declares start row 0 but moves sequence 1's start: the start mask must
    cover only the declared rows."""

    def act(env, _):
        env.batch.start[1] += T

    problems, _ = _audit(monkeypatch, [Region(START, 0, 1, 0, 1, Access.WRITE)], act)
    assert problems == ["#0 op/main[0] wrote start[1, 0] (1 elements) outside its declared regions"]


def test_a_cache_write_to_another_sequences_page_is_reported(monkeypatch):
    """Declares the cache rows of sequence 0 (tokens 0, 1 -> pool rows 8*2+3, 8*2+4) but writes token 0
    of sequence 1 (slot 0, position 5 -> pool row 5): only the declared tokens' pool rows may change."""

    def act(env, _):
        k = env.cache.layers[0].tensors["k"]
        k[19:21] = 1.0  # declared
        k[5, 1] = 1.0  # sequence 1's page

    problems, _ = _audit(monkeypatch, [Region(KCACHE, 0, 2, 0, 2, Access.WRITE)], act)
    assert problems == ["#0 op/main[0] wrote L0.k[5, 1] (1 elements) outside its declared regions"]


def test_the_report_names_the_first_stray_element_and_counts_only_strays(monkeypatch):
    """Writes x[0, :] (declared) and x[1, 0], x[1, 2] (not): the report names x[1, 0], the first undeclared
    element in row-major order, and counts 2 elements, not the 5 that changed."""

    def act(env, _):
        env.buf["x"][0] = 1.0
        env.buf["x"][1, 0] = 2.0
        env.buf["x"][1, 2] = 3.0

    problems, _ = _audit(monkeypatch, [Region(X, 0, 1, 0, 3, Access.WRITE)], act)
    assert problems == ["#0 op/main[0] wrote buf.x[1, 0] (2 elements) outside its declared regions"]


def test_a_workspace_write_of_the_value_it_already_held_is_caught(monkeypatch):
    """The workspace holds 5.0 before the step (left by an earlier one) and the task writes 5.0 into an
    element it does not declare: only the poisoning the audit does first makes that write visible."""

    def act(_, ws):
        ws[("ws", "cpu", torch.float32)][4] = 5.0

    problems, _ = _audit(
        monkeypatch,
        [Region(X, 0, 1, 0, 3, Access.WRITE)],
        act,
        workspaces={("ws", torch.float32): torch.full((6,), 5.0)},
    )
    assert problems == ["#0 op/main[0] wrote workspace.ws.float32[0, 4] (1 elements) outside its declared regions"]


def test_an_integer_workspace_write_of_zero_is_caught(monkeypatch):
    """An int32 workspace, zero before the step, gets a 0 written where the task declares nothing: the
    audit's -1 poison for integer workspaces (not 0) makes it show; the phase counters are left alone."""
    phases = torch.zeros(4, dtype=torch.int32)

    def act(_, ws):
        ws[("ws", "cpu", torch.int32)][2] = 0

    problems, _ = _audit(
        monkeypatch,
        [Region(X, 0, 1, 0, 3, Access.WRITE)],
        act,
        workspaces={
            ("ws", torch.int32): torch.zeros(6, dtype=torch.int32),
            ("ws.phases", torch.int32): phases,
        },
    )
    assert problems == ["#0 op/main[0] wrote workspace.ws.int32[0, 2] (1 elements) outside its declared regions"]
    assert phases.tolist() == [0, 0, 0, 0]


def test_a_scratch_region_allows_exactly_its_elements_of_the_workspace(monkeypatch):
    """Scratch ``ws`` is [2, 3]; the region rows 1, cols 1:3 is flat elements 4, 5 of its workspace. Writing
    4 and 5 is fine; writing element 3 (row 1, col 0) is reported; and a workspace whose name only starts
    with ``ws.`` (``ws.other``) is another workspace, which the region does not cover."""
    region = [Region(WS, 1, 2, 1, 3, Access.WRITE)]
    spaces = {
        ("ws", torch.float32): torch.zeros(6),
        ("ws.other", torch.float32): torch.zeros(6),
    }

    def ok(_, ws):
        ws[("ws", "cpu", torch.float32)][4:6] = 1.0

    assert _audit(monkeypatch, region, ok, workspaces=dict(spaces))[0] == []

    def stray(_, ws):
        ws[("ws", "cpu", torch.float32)][3:6] = 1.0

    problems, _ = _audit(monkeypatch, region, stray, workspaces=dict(spaces))
    assert problems == ["#0 op/main[0] wrote workspace.ws.float32[0, 3] (1 elements) outside its declared regions"]

    def other(_, ws):
        ws[("ws.other", "cpu", torch.float32)][4] = 1.0

    problems, _ = _audit(monkeypatch, region, other, workspaces=dict(spaces))
    assert problems == [
        "#0 op/main[0] wrote workspace.ws.other.float32[0, 4] (1 elements) outside its declared regions"
    ]


def test_kda_history_writes_are_checked_per_slot(monkeypatch):
    """keep_states: a task declaring the state of sequence 0 (slot 2) may fill slot 2's history (every
    token, its columns) but not slot 0's; and an undeclared history write is seen at all (the histories are
    among the tensors compared)."""
    region = [Region(REC, 0, 1, 0, 4, Access.WRITE)]

    def own(env, _):
        kda = env.cache.layers[1]
        kda.recurrent[2] = 1.0
        kda.history_recurrent[2] = 1.0

    assert _audit(monkeypatch, region, own, keep_states=True)[0] == []

    def other(env, _):
        env.cache.layers[1].history_recurrent[0, 1, 0, 1, 0] = 1.0  # slot 0, token 1, value 2 -> col 1*4 + 2

    problems, _ = _audit(monkeypatch, region, other, keep_states=True)
    assert problems == ["#0 op/main[0] wrote L1.history_recurrent[0, 6] (1 elements) outside its declared regions"]


@pytest.mark.parametrize("keep_states", [False, True])
def test_a_state_write_to_another_slot_is_reported(monkeypatch, keep_states):
    """Declares sequence 1's state (slot 0) but writes slot 1 (no sequence of the step)."""

    def act(env, _):
        env.cache.layers[1].recurrent[1, 0, 0, 0] = 1.0

    problems, _ = _audit(
        monkeypatch,
        [Region(REC, 1, 2, 0, 4, Access.WRITE)],
        act,
        keep_states=keep_states,
    )
    assert problems == ["#0 op/main[0] wrote L1.recurrent[1, 0] (1 elements) outside its declared regions"]


def test_a_routing_table_task_may_change_only_the_routing_workspaces(monkeypatch):
    """``moe_experts.route`` stands for the ``moe_experts.ids`` / ``.p`` workspaces: a task declaring any of it
    may change those anywhere, but a write to another workspace (``mlp.h``) is still reported."""
    region = [Region(ROUTE, 0, 1, 0, 1, Access.WRITE)]
    spaces = {
        ("moe_experts.ids", torch.int32): torch.zeros(6, dtype=torch.int32),
        ("moe_experts.p", torch.float32): torch.zeros(6),
        ("mlp.h", torch.float32): torch.zeros(6),
    }

    def parts(_, ws):
        ws[("moe_experts.ids", "cpu", torch.int32)][5] = 3
        ws[("moe_experts.p", "cpu", torch.float32)][4] = 0.5

    assert _audit(monkeypatch, region, parts, workspaces=dict(spaces))[0] == []

    def other(_, ws):
        ws[("mlp.h", "cpu", torch.float32)][1] = 1.0

    problems, _ = _audit(monkeypatch, region, other, workspaces=dict(spaces))
    assert problems == ["#0 op/main[0] wrote workspace.mlp.h.float32[0, 1] (1 elements) outside its declared regions"]
