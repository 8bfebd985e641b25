"""The schedules the megakernel runs, for every tiny family: they validate, their tiles write each op's outputs
exactly once, weight slices stream each GEMV weight row once, counters are epoch-based, the kernel's task
table encodes the same tasks, and a K3-shaped step (real widths, weights on the meta device, tiled for an
H100) validates too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nonstop.runtime.megakernel import validate
from nonstop.runtime.megakernel.tasks import Access
from nonstop.runtime.megakernel.verify.shadow import region_index
from nonstop.runtime.megakernel.verify.stats import format_stats, schedule_stats
from tests.megakernel.kernel_steps import kernel_step
from tests.tiny_configs import TINY_CONFIGS


@pytest.fixture(scope="module", params=list(TINY_CONFIGS))
def step(request):
    return kernel_step(request.param, B=2, T=2)


def test_schedule_validates(step):
    s = step.schedule
    validate(s)
    assert s.persistent and [op.name for op in s.ops] == [op.name for op in step.ops]
    ops_in_queue = [t.op for t in s.tasks]
    assert ops_in_queue == sorted(ops_in_queue), "tasks run op after op"
    for t in s.tasks:
        for w in t.waits:
            assert w.per_step == s.counters[w.counter].per_step and w.base in (0, w.per_step)


def test_experts_wait_only_for_their_producers():
    """A counter per set of written buffers: moe_experts waits for moe_front's router and latent tiles,
    not its shared-expert tiles."""
    s = kernel_step("kimi_k3", B=1, T=1).schedule
    experts = next(t for t in s.tasks if s.ops[t.op].name == "L1.moe_experts" and t.stage == 0)
    waited = {s.counters[w.counter].name for w in experts.waits if w.base}
    assert waited == {"L1.moe_front/main:moe_logits", "L1.moe_front/main:moe_in+moe_out"}, waited


def test_tiles_write_each_output_exactly_once(step):
    """Every element of an op's output buffers is written by exactly one tile of the op's last stage
    (moe_experts included: its down tiles store, no tile accumulates)."""
    s = step.schedule
    for oi, info in enumerate(s.ops):
        op = step.ops[info.program_op]
        for name in op.writes:
            b = s.buffer_index(name)
            writes = np.zeros(s.buffers[b].size, np.int64)
            for t in s.tasks:
                if t.op != oi:
                    continue
                for r in t.regions:
                    assert r.access != Access.ACCUMULATE, (s.task_name(s.tasks.index(t)), name)
                    if (
                        r.buffer == b
                        and r.access == Access.WRITE
                        and (t.stage == len(info.stages) - 1 or op.kind == "gqa_attn")
                    ):
                        writes[region_index(r, s.buffers[b].cols)] += 1
            if op.kind == "gqa_attn":  # split 0 writes a sequence that fits one split, combine every one
                assert (writes >= 1).all(), op.name
            elif name == "token_log":  # advance writes the row of each sequence (a ring of tokens by position)
                assert (writes.reshape(s.buffers[b].rows, -1)[: s.B] == 1).all() and not writes.reshape(
                    s.buffers[b].rows, -1
                )[s.B :].any()
            else:
                assert (writes == 1).all(), f"{op.name} writes {name}: counts {np.unique(writes)}"


def test_gemv_weights_are_streamed_once(step):
    """The tiles of a GEMV kind slice its weight rows into a partition of dim 0."""
    s = step.schedule
    roles = {
        "linear_residual": "w",
        "lm_head": "w",
        "mla_in_proj": "w_in",
        "kda_in_proj": "w_in",
        "moe_front": "router",
    }
    for oi, info in enumerate(s.ops):
        role = roles.get(info.kind)
        if role is None:
            continue
        spans = sorted((w.start, w.stop) for t in s.tasks if t.op == oi for w in t.weights if w.role == role)
        rows = step.ops[info.program_op].weights[role].shape[0]
        assert spans[0][0] == 0 and spans[-1][1] == rows and all(a[1] == b[0] for a, b in zip(spans, spans[1:])), (
            info.name,
            spans,
        )


def test_prefetch_order_and_dynamic_weights(step):
    s = step.schedule
    order = s.prefetch_order()
    assert [i for i, _ in order] == sorted(i for i, _ in order)
    assert sum(w.nbytes for _, w in order) == sum(t.weight_bytes for t in s.tasks)
    for i, w in order:
        kind = s.ops[s.tasks[i].op].kind
        assert w.dynamic == (kind == "embed" or (kind == "moe_experts" and w.role != "bias")), (s.task_name(i), w)


def test_the_kernel_table_encodes_the_schedule():
    """The StepKernel's task table: one row per task with its tile, tile count, counter and waits, and the
    opcode of the task class whose stage it is."""
    from nonstop.runtime.megakernel.kernel import StepKernel
    from nonstop.runtime.superop import ExecEnv

    ks = kernel_step("deepseek_v3", B=2, T=1)
    ex = ks.executor
    step = ex.static_step(2, 1)
    mk = StepKernel(ex.program, ks.ops, ex.impl, ExecEnv(step.buf, ks.steps.cache, step.batch), "cpu")
    s, tasks, waits = mk.schedule, mk.tasks.tolist(), mk.waits.tolist()
    assert len(tasks) == len(s.tasks)
    for row, t in zip(tasks, s.tasks):
        opcode, _, tile, ntiles, counter, w0, w1 = row
        cls = mk.plan.classes[opcode]
        assert cls.label.endswith("/" + s.ops[t.op].stages[t.stage].name) and tile == t.tile and counter == t.counter
        assert ntiles == len(s.ops[t.op].stages[t.stage].tiles)
        assert [tuple(w) for w in waits[w0:w1]] == [(w.counter, w.base, w.per_step) for w in t.waits]


def test_stats(step):
    s = step.schedule
    st = schedule_stats(s)
    assert st["tasks"] == len(s.tasks) and st["weight_bytes"] == sum(t.weight_bytes for t in s.tasks)
    assert 1 <= st["depth"] <= len(s.counters)
    text = format_stats(s)
    assert "per task p0" in text and any(kind in text for kind in ("kda_core", "gqa_attn", "mla_attn"))


def test_k3_shaped_schedule_validates():
    """Real K3 widths (meta weights, first 4 layers: KDA, MLA, dense and MoE FFNs), 2 x 2 rows, the launches
    recorded as on an H100 (132 SMs): thousands of tasks build and validate."""
    from nonstop.cache.state import ModelCache
    from nonstop.config import ModelConfig
    from nonstop.kernels import platform
    from nonstop.model.stack import CausalLM
    from nonstop.program.lower import lower
    from nonstop.runtime.megakernel import advance
    from nonstop.runtime.megakernel.executor import megakernel_program
    from nonstop.runtime.megakernel.kernel import step_schedule
    from nonstop.runtime.superop import ExecEnv, kernel_table

    cfg = ModelConfig.preset("kimi-k3").with_num_layers(4)
    with torch.device("meta"):
        model = CausalLM(cfg).to(torch.bfloat16)
    program, extra = megakernel_program(lower(model), cfg.vocab_size)
    cache = ModelCache(cfg, 2, capacity=32, dtype=torch.bfloat16, device="cpu")
    prefill = cache.batch([0, 1], 5)
    cache.advance(prefill)
    batch = cache.batch([0, 1], 2)
    for layer in cache.layers:
        if hasattr(layer, "fit_pool"):
            layer.fit_pool()
    impl = dict(kernel_table(), advance=advance.launch)
    with platform.simulating(platform.H100):
        _, _, s, *_ = step_schedule(
            program, [*program.ops, *extra], impl, ExecEnv(program.allocate(4, "cpu"), cache, batch), "cpu"
        )
    assert len(s.tasks) > 5_000
    validate(s)
