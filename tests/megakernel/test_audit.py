"""``audit_writes``: the declarations the schedule validator trusts hold for the code that runs.

A step runs task by task under the Triton interpreter; every tensor a task could reach (activation
buffers, ``start``, every cache layer's pool / state / history, every kernel workspace) is compared
before and after each task. The step's sequences sit in slots 2 and 0 of a three-slot cache (row b is
not slot b, and slot 1 is a bystander), and a task whose declarations are altered is caught, by the
tensor it wrote."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.runtime.helpers import tiny_model
from tests.tiny_configs import TINY_CONFIGS

pytest.importorskip("triton")

from nonstop.cache.state import ModelCache  # noqa: E402
from nonstop.kernels import launch, platform  # noqa: E402
from nonstop.runtime.cuda_graph import fit_pools  # noqa: E402
from nonstop.runtime.megakernel.executor import MegakernelExecutor  # noqa: E402
from nonstop.runtime.megakernel.tasks import Access  # noqa: E402
from nonstop.runtime.megakernel.verify.audit import audit_writes  # noqa: E402
from nonstop.runtime.superop import ExecEnv  # noqa: E402

SLOTS = [2, 0]


def recorded_step(name: str, keep_states: bool = False, monkeypatch=None, cached=(3, 4)):
    """(megakernel, env) of a step of B = 2 sequences (slots 2 and 0, ``cached`` tokens already in the
    cache) x T = 2 tokens, recorded but not launched."""
    import nonstop.kernels.gqa as gqa

    if monkeypatch is not None:
        monkeypatch.setattr(gqa, "PAIRS_PER_TILE", 2)  # several RoPE tiles per head
    model = tiny_model(name)
    ex = MegakernelExecutor(model, graphs=False)
    cache = ModelCache(model.cfg, 3, capacity=max(cached) + 2, dtype=torch.float32, device="cpu", page_size=4)
    for slot, n in zip(SLOTS, cached):
        prompt = [(7 * i + slot) % 50 + 1 for i in range(n)]
        prefill = cache.batch([slot], len(prompt))
        model(torch.tensor([prompt]), cache, prefill)
        cache.advance(prefill)
    batch = cache.batch(SLOTS, 2, keep_states=keep_states)
    step = ex.static_step(2, 2, keep_states)
    fit_pools(cache)
    step.buf["ids"].copy_(torch.tensor([7, 8, 9, 10]))
    step.slots.copy_(batch.slots)
    step.start.copy_(batch.start)
    env = ExecEnv(step.buf, cache, step.batch)
    return ex.step_kernel(env), env


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_tasks_write_only_their_declared_regions(name, monkeypatch):
    """Every family's decode step: no task changes an element outside its declared writes — in the
    activations, the attention pages of its own tokens, its own sequences' KDA slots, its workspaces."""
    mk, env = recorded_step(name, monkeypatch=monkeypatch)
    assert audit_writes(mk, env) == []


def test_a_verification_step_writes_the_kda_histories_it_declares():
    """keep_states (speculative verification): the KDA tasks fill their slots' per-token histories,
    which their state regions cover; nothing else changes."""
    mk, env = recorded_step("kimi_linear", keep_states=True)
    assert audit_writes(mk, env) == []
    histories = [layer.history_recurrent for layer in env.cache.layers if hasattr(layer, "history_recurrent")]
    assert any(h is not None and bool(h[SLOTS].ne(0).any()) for h in histories)  # the audit saw them written


def _drop_writes(mk, kind: str, pick=lambda info: True) -> tuple[str, str]:
    """Remove the WRITE / ACCUMULATE regions on buffers of ``kind`` from the first task that has one
    (on a buffer ``pick`` accepts); returns (task name, buffer name)."""
    s = mk.schedule
    for i, task in enumerate(s.tasks):
        hit = [
            r
            for r in task.regions
            if r.access in (Access.WRITE, Access.ACCUMULATE)
            and s.buffers[r.buffer].kind == kind
            and pick(s.buffers[r.buffer])
        ]
        if hit:
            s.tasks[i] = dataclasses.replace(task, regions=tuple(r for r in task.regions if r not in hit))
            return s.task_name(i), s.buffers[hit[0].buffer].name
    raise AssertionError(f"no task writes a {kind} buffer")


@pytest.mark.parametrize(("name", "attn"), [("llama", "gqa_attn"), ("deepseek_v3", "mla_attn")])
def test_split_kv_partials_stay_in_their_workspaces(name, attn):
    """A sequence of 300 tokens split over two KV splits (an interpreter with 8 SMs asks for more programs
    than one split of at least 128 keys gives): the split tiles write the attention partials (the split-KV
    workspaces), the combine tiles merge them; nothing undeclared changes, and a split tile whose
    partial writes are left out is reported."""
    with platform.simulating(dataclasses.replace(platform.INTERPRETER, sms=8)):
        mk, env = recorded_step(name, cached=(300, 3))
        assert audit_writes(mk, env) == []
        partials = [t for (n, _, _), t in launch._WORKSPACES.items() if n == f"{attn}.acc"]
        assert any(bool(t.isfinite().any()) for t in partials)  # written (the audit poisons them with NaN first)
        mk, env = recorded_step(name, cached=(300, 3))  # a fresh step: the audit ran (advanced) the first
        task, _ = _drop_writes(mk, "scratch", lambda b: b.name == f"{attn}.partial")
        problems = audit_writes(mk, env)
    assert any(p.startswith(f"{task} wrote workspace.{attn}.") for p in problems), (task, problems)


@pytest.mark.parametrize(
    ("name", "kind", "pick", "tensor"),
    [
        ("llama", "cache", lambda b: True, "L{layer}.{tensor}"),  # the new tokens' K or V pages
        ("deepseek_v3", "cache", lambda b: True, "L{layer}.{tensor}"),  # the MLA latent pages
        ("kimi_linear", "state", lambda b: b.tensor == "conv", "L{layer}.conv"),
        ("kimi_linear", "state", lambda b: b.tensor == "recurrent", "L{layer}.recurrent"),
        ("llama", "step", lambda b: True, "start"),  # advance's start += T
        ("llama", "scratch", lambda b: b.name == "mlp.h", "workspace.mlp.h."),  # a workspace of its own layout
        ("llama", "scratch", lambda b: b.name == "sample.partial", "workspace.sample."),  # one of several
        ("llama", "scratch", lambda b: b.name == "sample.path", "workspace.sample.path."),
    ],
)
def test_an_undeclared_write_is_reported_by_the_tensor_it_changed(name, kind, pick, tensor):
    """Declarations with a task's cache / state / start / workspace writes left out: the audit names
    that task and the real tensor (a cache pool, a KDA slot array, a workspace) it changed."""
    mk, env = recorded_step(name)
    task, buffer = _drop_writes(mk, kind, pick)
    info = next(b for b in mk.schedule.buffers if b.name == buffer)
    want = tensor.format(layer=info.layer, tensor=info.tensor)
    problems = audit_writes(mk, env)
    assert any(p.startswith(f"{task} wrote {want}") for p in problems), (task, want, problems)


def test_a_state_region_of_the_wrong_sequence_is_reported():
    """A KDA task that declares the other sequence's slot: its writes to its own slot are undeclared."""
    mk, env = recorded_step("kimi_linear")
    s = mk.schedule
    i, task = next(
        (i, t)
        for i, t in enumerate(s.tasks)
        if any(r.access == Access.WRITE and s.buffers[r.buffer].kind == "state" and r.r0 == 0 for r in t.regions)
    )
    swapped = tuple(
        dataclasses.replace(r, r0=1, r1=2) if s.buffers[r.buffer].kind == "state" and r.r0 == 0 else r
        for r in task.regions
    )
    s.tasks[i] = dataclasses.replace(task, regions=swapped)
    layer = s.buffers[next(r.buffer for r in task.regions if s.buffers[r.buffer].kind == "state")].layer
    problems = [p for p in audit_writes(mk, env) if p.startswith(s.task_name(i))]
    assert any(f"wrote L{layer}." in p and f"[{SLOTS[0]}, " in p for p in problems), problems


def test_swapped_lm_head_declarations_are_reported():
    """Two LM-head tiles with each other's regions: each writes logits columns it did not declare."""
    mk, env = recorded_step("llama")
    s = mk.schedule
    i, j = [k for k, t in enumerate(s.tasks) if s.ops[t.op].kind == "lm_head"][:2]
    s.tasks[i], s.tasks[j] = (
        dataclasses.replace(s.tasks[i], regions=s.tasks[j].regions),
        dataclasses.replace(s.tasks[j], regions=s.tasks[i].regions),
    )
    assert any("lm_head" in p and "buf.logits" in p for p in audit_writes(mk, env))
