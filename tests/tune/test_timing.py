"""The timing plan and its judgement (the CUDA-event loop itself needs a GPU): every launch gets a
pairing of weights and inputs no other launch had, the parent checks the kept outputs of timed launches
against the twin, and a median below the bandwidth floor is rejected as impossible."""

from __future__ import annotations

import random

import pytest
import torch

from nonstop.tune import timing
from nonstop.tune.cases import CaseSpec
from nonstop.tune.judge import TOLERANCE
from tests.tune.helpers import tiny_target


@pytest.fixture(scope="module")
def plan():
    t = tiny_target("linear_residual")
    shape = t.shapes[1]
    spec = CaseSpec("tuned", t.cfg, t.dtype, shape.B, shape.T, False, shape.variant, context=24)
    return timing.plan_timing(shape.key, spec, "linear_residual", "cpu", random.Random(7)), shape


def _measured(plan, ms: float, corrupt: bool = False) -> dict:
    outputs = {}
    for launch in plan.checked:
        _, after = timing.twin_after(plan, launch, "cpu")
        outputs[launch] = {s: after[s].clone() for s in plan.outputs}
    if corrupt:
        outputs[plan.checked[3]][plan.outputs[0]][:8] ^= 0x55
    return {
        "ms": [ms] * (len(plan.sequence) - timing.WARMUP),
        "outputs": outputs,
        "modified": [],
        "guards_broken": [],
        "violations": [],
        "triton_launches": 64,
    }


def test_every_launch_sees_a_new_pairing(plan):
    plan, _ = plan
    assert sorted(plan.sequence) == [(j, k) for j in range(timing.WEIGHT_DRAWS) for k in range(timing.INPUT_DRAWS)]
    assert len(plan.checked) == timing.CHECKED + 1 and plan.checked[-1] == len(plan.sequence) - 1
    assert all(not torch.equal(a[s], b[s]) for a, b in zip(plan.weights, plan.weights[1:]) for s in a)
    assert all(
        not torch.equal(a[s], b[s]) for a, b in zip(plan.inputs, plan.inputs[1:]) for s in a if a[s].numel() > 64
    )


@pytest.mark.parametrize("times_floor", [2.0, 1.001, 0.5])
def test_a_median_below_the_bandwidth_floor_is_rejected(plan, monkeypatch, times_floor):
    """With a peak of 1 GB/s the floor is bytes / 1e9 s: a median at or above it passes, below is impossible."""
    plan, shape = plan
    monkeypatch.setattr(timing, "peak_bandwidth", lambda device: (1e9, "test"))
    floor_ms = shape.bytes_moved / 1e9 * 1e3
    measured = _measured(plan, times_floor * floor_ms)
    problems, entry = timing.judge_timing(plan, measured, shape.bytes_moved, "cpu", TOLERANCE[torch.float32])
    if times_floor >= 1:
        assert problems == [] and entry["median_ms"] == pytest.approx(times_floor * floor_ms)
        assert entry["floor_ms"] == pytest.approx(floor_ms) and entry["launches"] == len(plan.sequence) - timing.WARMUP
    else:
        assert problems and "faster than the bandwidth floor" in problems[0] and entry == {}


def test_a_wrong_timed_launch_is_rejected(plan):
    plan, shape = plan
    problems, _ = timing.judge_timing(
        plan, _measured(plan, 1.0, corrupt=True), shape.bytes_moved, "cpu", TOLERANCE[torch.float32]
    )
    assert problems and f"launch {plan.checked[3]}" in problems[0]


def test_peak_bandwidth_without_a_gpu_times_nothing():
    assert timing.peak_bandwidth("cpu") == (float("inf"), "cpu: untimed")


def test_the_datasheet_takes_the_most_specific_name():
    """Each listed GPU gets its own figure, whatever the table's order: a GH200's name also holds "H200", an
    H100 NVL's "H100", an A100-SXM4-80GB's "A100"."""
    assert timing.datasheet_bandwidth("NVIDIA GH200 480GB") == 4.9e12
    assert timing.datasheet_bandwidth("NVIDIA H200") == 4.8e12
    assert timing.datasheet_bandwidth("NVIDIA H100 NVL") == 3.9e12
    assert timing.datasheet_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert timing.datasheet_bandwidth("NVIDIA A100-SXM4-80GB") == 2.039e12
    assert timing.datasheet_bandwidth("NVIDIA A100-PCIE-40GB") == 1.555e12
    assert timing.datasheet_bandwidth("NVIDIA GeForce RTX 4090") == 0.0
