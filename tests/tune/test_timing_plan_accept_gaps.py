"""Timing and plan gaps of the verifier that would let a bad candidate through: ``judge_timing`` must take the
MEDIAN against the bandwidth floor (a few slow launches must not hide impossible fast ones) and must reject
timed launches that wrote their inputs or a guard band; ``verify.plan`` must always hold at least 5 cases,
3 of them hidden (odd shapes a special-cased kernel has not seen)."""

from __future__ import annotations

import random

import pytest
import torch

from nonstop.tune import timing
from nonstop.tune.cases import CaseSpec
from nonstop.tune.judge import TOLERANCE
from nonstop.tune.verify import plan
from tests.tune.helpers import tiny_target


@pytest.fixture(scope="module")
def timed():
    t = tiny_target("linear_residual")
    shape = t.shapes[0]
    spec = CaseSpec("tuned", t.cfg, t.dtype, shape.B, shape.T, False, shape.variant, context=8)
    return timing.plan_timing(shape.key, spec, "linear_residual", "cpu", random.Random(3)), shape


def measured(plan_, ms: list[float], **extra) -> dict:
    outputs = {}
    for launch in plan_.checked:
        _, after = timing.twin_after(plan_, launch, "cpu")
        outputs[launch] = {s: after[s].clone() for s in plan_.outputs}
    base = {"ms": ms, "outputs": outputs, "modified": [], "guards_broken": [], "violations": []}
    return {**base, "triton_launches": len(ms), **extra}


def test_mostly_impossible_launch_times_are_rejected_despite_a_few_slow_ones(timed, monkeypatch):
    """Floor = bytes / 1 GB/s. 59 launches at 0.1 x floor and one at 10 x floor: the median is below the floor,
    so rejected. Catches judging the max (or a mean) instead of the median, or a loosened floor."""
    plan_, shape = timed
    monkeypatch.setattr(timing, "peak_bandwidth", lambda device: (1e9, "test"))
    floor_ms = shape.bytes_moved / 1e9 * 1e3
    n = len(plan_.sequence) - timing.WARMUP
    ms = [0.1 * floor_ms] * (n - 1) + [10 * floor_ms]
    problems, entry = timing.judge_timing(
        plan_, measured(plan_, ms), shape.bytes_moved, "cpu", TOLERANCE[torch.float32]
    )
    assert problems and "faster than the bandwidth floor" in problems[0] and entry == {}, problems


def test_a_median_at_half_the_floor_is_rejected(timed, monkeypatch):
    """Half the floor is impossible: catches a floor divided by any factor above 2."""
    plan_, shape = timed
    monkeypatch.setattr(timing, "peak_bandwidth", lambda device: (1e9, "test"))
    floor_ms = shape.bytes_moved / 1e9 * 1e3
    n = len(plan_.sequence) - timing.WARMUP
    problems, _ = timing.judge_timing(
        plan_, measured(plan_, [0.6 * floor_ms] * n), shape.bytes_moved, "cpu", TOLERANCE[torch.float32]
    )
    assert problems and "faster than the bandwidth floor" in problems[0], problems


@pytest.mark.parametrize(
    "extra,phrase",
    [
        ({"modified": [0]}, "into its inputs (storages [0])"),
        ({"guards_broken": [2]}, "wrote outside its tensors"),
        ({"violations": ["torch operator aten.mm run by the candidate"]}, "aten.mm"),
    ],
)
def test_timed_launches_that_broke_a_rule_are_rejected(timed, extra, phrase):
    """Right outputs and slow enough, but a timed launch wrote an input, a guard band, or ran torch compute:
    catches a dropped check in ``judge_timing``."""
    plan_, shape = timed
    n = len(plan_.sequence) - timing.WARMUP
    problems, entry = timing.judge_timing(
        plan_, measured(plan_, [1.0] * n, **extra), shape.bytes_moved, "cpu", TOLERANCE[torch.float32]
    )
    assert problems and phrase in problems[0] and entry == {}, problems


def test_a_measurement_that_did_not_come_back_is_rejected(timed):
    plan_, shape = timed
    problems, _ = timing.judge_timing(plan_, None, shape.bytes_moved, "cpu", TOLERANCE[torch.float32])
    assert problems and "no measurement came back" in problems[0]
    problems, _ = timing.judge_timing(plan_, {"error": "boom"}, shape.bytes_moved, "cpu", TOLERANCE[torch.float32])
    assert problems and "boom" in problems[0]


@pytest.mark.parametrize("rows", [(1,), (1, 3), (1, 2, 3, 4, 5, 6)])
def test_every_plan_has_five_cases_three_of_them_hidden(rows):
    """Whatever the number of tuned shapes: at least 5 cases, at least 3 hidden ones with odd widths and a
    (1, 1) and (3, 1) step and a speculative one of several tokens among them. Catches dropped hidden cases or a
    smaller minimum."""
    from nonstop.config import ModelConfig
    from nonstop.tune.target import make_target
    from tests.tiny_configs import TINY_CONFIGS

    cfg = ModelConfig.from_hf_dict(TINY_CONFIGS["llama"])
    target = make_target("linear_residual", "tiny-llama", cfg, torch.float32, "cpu", list(rows))
    for seed in range(3):
        specs = plan(target, random.Random(seed))
        hidden = [s for s in specs if s.label == "hidden"]
        assert len(specs) >= 5 and len(hidden) >= 3, [s.describe() for s in specs]
        assert {(s.B, s.T) for s in hidden} >= {(1, 1), (3, 1)}
        assert any(s.keep_states and s.T > 1 for s in hidden)
        assert all(s.cfg.hidden_size % 2 == 1 for s in hidden)


@pytest.mark.parametrize("B", [2, 3])
def test_the_last_sequence_of_a_batch_starts_fresh(B):
    """In a case of several sequences the last one starts at position 0 (an empty prefix) and the others do
    not: catches states where every sequence has a prefix, so a kernel wrong on an empty cache passes."""
    from nonstop.tune.cases import build_state

    t = tiny_target("gqa_attn")
    for seed in range(3):
        s = build_state(CaseSpec("hidden", t.cfg, torch.float32, B, 2, False, 0), "gqa_attn", "cpu", 1, seed)
        start = s.batch.start.tolist()
        assert start[-1] == 0 and all(x > 0 for x in start[:-1]), start


def test_a_second_forbidden_module_in_one_import_is_refused():
    """``import math, urllib``: every name of an import statement is checked, not only the first."""
    from nonstop.tune.allowed import path_problem
    from nonstop.tune.static_check import static_check

    src = "import math, urllib\nimport triton\n\n\n@triton.jit\ndef k(x):\n    pass\n\n\ndef launch(op, env):\n"
    src += '    k[(1,)](op.weights["w"])\n'
    problems = static_check(src, "linear_residual")
    assert any("import urllib is not allowed" in p for p in problems), problems
    assert "os is not an allowed module" in (path_problem(["os", "system"]) or "")
