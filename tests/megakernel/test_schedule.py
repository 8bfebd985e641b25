"""Schedules of every tiny family: they validate, their tiles cover each op's outputs exactly, weight
slices stream each GEMV weight row once, counters are epoch-based, and the descriptor encoding and
statistics describe the same tasks. A K3-shaped schedule (real widths, meta tensors) validates too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.program.lower import lower
from nonstop.runtime.megakernel import build_schedule, validate
from nonstop.runtime.megakernel.encode import describe_task, encode
from nonstop.runtime.megakernel.regions import Access
from nonstop.runtime.megakernel.shadow import region_index
from nonstop.runtime.megakernel.stats import format_stats, schedule_stats
from nonstop.runtime.megakernel.tilectx import TilingConfig
from tests.tiny_configs import TINY_CONFIGS

CONFIG = TilingConfig(block_n=8, attn_split=4, max_context=16, attn_block_m=4)


@pytest.fixture(scope="module", params=list(TINY_CONFIGS))
def program(request):
    return lower(random_model(ModelConfig.from_hf_dict(TINY_CONFIGS[request.param]), torch.float32, seed=2))


@pytest.mark.parametrize(
    "B,T,persistent,split", [(1, 1, True, False), (3, 2, True, False), (2, 3, False, False), (2, 2, True, True)]
)
def test_schedule_validates(program, B, T, persistent, split):
    s = build_schedule(program, B, T, CONFIG, persistent, split_counters=split)
    validate(s)
    assert [op.name for op in s.ops] == [op.name for op in program.ops] + (["next_ids"] if persistent else [])
    assert {s.ops[t.op].name for t in s.tasks} == {op.name for op in s.ops}
    ops_in_queue = [t.op for t in s.tasks]
    assert ops_in_queue == sorted(ops_in_queue), "tasks run op after op"
    for t in s.tasks:
        for w in t.waits:
            assert w.per_step == s.counters[w.counter].per_step and w.base in (0, w.per_step)
            assert w.base or persistent, "only persistent schedules wait on the previous step"


def test_split_counters_wait_only_for_producers():
    """With a counter per set of written buffers, moe_experts does not wait for the shared-expert tiles."""
    program = lower(random_model(ModelConfig.from_hf_dict(TINY_CONFIGS["kimi_k3"]), torch.float32, seed=2))
    s = build_schedule(program, 1, 1, CONFIG, True, split_counters=True)
    experts = next(t for t in s.tasks if s.ops[t.op].name == "L1.moe_experts")
    waited = {s.counters[w.counter].name for w in experts.waits}
    assert waited == {"L1.moe_front/main:moe_logits", "L1.moe_front/main:moe_in+moe_out"}


def test_tiles_write_each_output_exactly_once(program):
    """Every element of an op's output buffers is written by one tile of the op (or accumulated into)."""
    s = build_schedule(program, 2, 2, CONFIG, True)
    for oi, info in enumerate(s.ops):
        if info.program_op is None:
            continue
        op = program.ops[info.program_op]
        for name in op.writes:
            b = s.buffer_index(name)
            writes = np.zeros(s.buffers[b].size, np.int64)
            accumulated = np.zeros(s.buffers[b].size, bool)
            for t in s.tasks:
                for r in t.regions:
                    if t.op == oi and r.buffer == b:
                        idx = region_index(r, s.buffers[b].cols)
                        if r.access == Access.WRITE:
                            writes[idx] += 1
                        elif r.access == Access.ACCUMULATE:
                            accumulated[idx] = True
            if op.kind == "moe_experts":
                assert accumulated.all(), op.name
            else:
                assert (writes == 1).all(), f"{op.name} writes {name}: counts {np.unique(writes)}"


def test_gemv_weights_are_streamed_once(program):
    """The tiles of a GEMV kind slice its weight rows into a partition of dim 0."""
    s = build_schedule(program, 1, 1, CONFIG, True)
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
        rows = program.ops[info.program_op].weights[role].shape[0]
        assert spans[0][0] == 0 and spans[-1][1] == rows and all(a[1] == b[0] for a, b in zip(spans, spans[1:])), (
            info.name,
            spans,
        )


def test_prefetch_order_and_dynamic_weights(program):
    s = build_schedule(program, 2, 1, CONFIG, True)
    order = s.prefetch_order()
    assert [i for i, _ in order] == sorted(i for i, _ in order)
    assert sum(w.nbytes for _, w in order) == sum(t.weight_bytes for t in s.tasks)
    for i, w in order:
        kind = s.ops[s.tasks[i].op].kind
        assert w.dynamic == (kind == "embed" or (kind == "moe_experts" and w.role != "bias")), (s.task_name(i), w)


def test_encoding_describes_the_tasks(program):
    s = build_schedule(program, 2, 2, CONFIG, True)
    enc = encode(s)
    assert enc["tasks"].shape == (len(s.tasks), 9) and enc["counters"].dtype == torch.int64
    for i in range(0, len(s.tasks), 7):
        t, row = s.tasks[i], describe_task(enc, i)
        assert (row["opcode"], row["op"], row["stage"], row["tile"], row["counter"]) == (
            t.opcode,
            t.op,
            t.stage,
            t.tile,
            t.counter,
        )
        assert enc["opcodes"][t.opcode] == (s.ops[t.op].kind, s.ops[t.op].stages[t.stage].name)
        assert row["waits"] == [(w.counter, w.base, w.per_step) for w in t.waits]
        assert [(r, d, a, b, abs(n)) for r, d, a, b, n in row["weights"]] == [
            (w.role, w.dim, w.start, w.stop, w.nbytes) for w in t.weights
        ]


def test_stats(program):
    s = build_schedule(program, 1, 1, CONFIG, True)
    st = schedule_stats(s)
    assert st["tasks"] == len(s.tasks) and st["weight_bytes"] == sum(t.weight_bytes for t in s.tasks)
    assert 1 <= st["depth"] <= len(s.counters)
    text = format_stats(s)
    assert "per task p0" in text and any(kind in text for kind in ("kda_core", "gqa_attn", "mla_attn"))


def test_k3_shaped_schedule_validates():
    """Real K3 widths (meta tensors, first 4 layers: KDA, MLA, dense and MoE FFNs), 2 x 2 rows: tens
    of thousands of tasks build and validate (the validator is near-linear in tasks)."""
    from nonstop.model.stack import CausalLM

    cfg = ModelConfig.preset("kimi-k3").with_num_layers(4)
    with torch.device("meta"):
        model = CausalLM(cfg).to(torch.bfloat16)
    s = build_schedule(lower(model), B=2, T=2)
    assert len(s.tasks) > 10_000
    validate(s)


def test_timing_estimate_orders_the_variants():
    """The toy timing model never beats the bandwidth floor, and prefetching weights before the waits
    is never slower than waiting first."""
    from nonstop.runtime.megakernel.estimate import estimate_step

    program = lower(random_model(ModelConfig.from_hf_dict(TINY_CONFIGS["kimi_k3"]), torch.float32, seed=2))
    s = build_schedule(program, 2, 1, CONFIG, True)
    ahead, after = estimate_step(s, workers=8, prefetch=True), estimate_step(s, workers=8, prefetch=False)
    assert after["seconds"] >= ahead["seconds"] >= ahead["floor"] > 0
