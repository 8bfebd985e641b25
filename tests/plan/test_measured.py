"""nonstop's own CPU measurements beside the planner (``nonstop/plan/measured.py``): the cpu chip's
figures come from this machine, so results recorded on another CPU are labelled and never lend it their
bandwidth."""

import dataclasses
import json

import pytest
import torch

from nonstop.plan.measured import all_measurements, op_overhead_us, recorded_copy_gbps, this_cpu
from nonstop.plan.report import recorded_on


def _spec_result(cpu: str, gbps: float, time: str, tokens_per_s: float) -> dict:
    return {
        "benchmark": "spec_decode",
        "model": "k3-nano",
        "max_tokens": 64,
        "time": time,
        "machine": {"cpu": cpu, "threads": 1},
        "bandwidth_floor": {"copy_GBps": gbps},
        "results": {"heldout": {"prompt_tokens": [48], "modes": {"plain": {"decode_tokens_per_s": tokens_per_s}}}},
    }


def test_only_this_cpus_results_lend_it_their_bandwidth(tmp_path):
    here = this_cpu()
    results = {
        "a_here.json": _spec_result(here, 11.0, "2026-01-01T00:00:00", 100.0),
        "b_other.json": _spec_result(here + " (another)", 99.0, "2026-06-01T00:00:00", 50.0),  # newer
    }
    for name, data in results.items():
        (tmp_path / name).write_text(json.dumps(data))
    assert recorded_copy_gbps(tmp_path) == (11.0, "a_here.json")
    rows = all_measurements("cpu", tmp_path)
    assert [recorded_on(m) for m in rows] == ["this CPU", here + " (another)"]
    (tmp_path / "a_here.json").unlink()
    assert recorded_copy_gbps(tmp_path) is None  # measured now instead, never borrowed


def test_the_eager_per_op_cost_is_measured_on_one_thread_and_restores_the_pool():
    threads = torch.get_num_threads()
    op_overhead_us.cache_clear()
    cost = op_overhead_us()
    assert torch.get_num_threads() == threads
    assert 0.05 < cost < 1000  # microseconds per aten op of the reference executor


def test_an_eager_speculative_step_counts_its_verify_rows_and_its_drafter_ops():
    """The eager executor pays per aten op: a verify step of K+1 rows (each computed as a one-token step)
    dispatches more ops than a plain step, and the eager drafter more than one op per weight tensor;
    both are counted on narrow twins, and the step's kernels are their sum."""
    import json as _json

    from nonstop.plan.chips import get_chip
    from nonstop.plan.draft import draft_shape, eager_draft_ops
    from nonstop.plan.layout import Layout
    from nonstop.plan.predict import Spec, _eager_ops, predict
    from nonstop.plan.workload import Precision, build_workload
    from nonstop.weights.resolve import resolve_model

    cfg, model_dir = resolve_model("k3-nano")
    key = _json.dumps(cfg.to_hf_dict(), sort_keys=True)
    plain_ops, verify_ops = _eager_ops(key, 1), _eager_ops(key, 3)
    assert verify_ops > 1.5 * plain_ops
    drafter_ops = eager_draft_ops(cfg, model_dir, 2, 3)
    assert drafter_ops > 3 * draft_shape(cfg, model_dir, 2).kernels
    workload = build_workload(cfg, "k3-nano", Precision("fp32", "fp32"))
    spec = predict(workload, get_chip("cpu"), Layout(), 1, 64, Spec(2.5, 2), "eager", model_dir=model_dir)
    assert spec.time.kernels == verify_ops + drafter_ops


def _decode_result(gpu: str) -> dict:
    """A bench/decode.py report: llama-3.2-1b whole, a kimi-k3 slice timed at 3 layers and at 1."""

    def slice_(layers, ms):
        rows = [{"row": "superop", "ms_per_token": ms}, {"row": "eager", "ms_per_token": 10 * ms}]
        return {"layers": layers, "timings": [{"context": 132, "rows": rows}]}

    return {
        "bench": "decode",
        "environment": {"gpu": gpu},
        "shapes": [
            {"shape": "llama-3.2-1b", "preset": "llama-3.2-1b", "full_layers": 16, "slices": [slice_(16, 1.5)]},
            {
                "shape": "kimi-k3-slice",
                "preset": "kimi-k3",
                "full_layers": 93,
                "slices": [slice_(3, 5.0), slice_(1, 1.5)],
            },
        ],
    }


def test_gpu_slices_are_predicted_as_the_models_they_time(tmp_path):
    from nonstop.config import ModelConfig
    from nonstop.plan.chips import get_chip
    from nonstop.plan.measured import measurements
    from nonstop.plan.report import measured_side_by_side, workload_for_measurement
    from nonstop.plan.timing import Constants

    (tmp_path / "decode_nvidia-h200.json").write_text(json.dumps(_decode_result("NVIDIA H200")))
    assert all_measurements("h100", tmp_path) == []  # another chip's runs are not this one's
    rows = all_measurements("h200", tmp_path)
    assert [(m.ms_per_token, m.executor, m.engine_loop) for m in rows] == [
        (1.5, "kernels", False),  # the executor rows only (not eager), each a bare step
        (5.0, "kernels", False),
        (1.5, "kernels", False),
    ]
    assert rows[0].model == "llama-3.2-1b" and rows[1].model is None
    k3 = ModelConfig.preset("kimi-k3")
    assert [m.ms_per_token for m in measurements(k3.with_num_layers(3), "kimi-k3", "h200", tmp_path)] == [5.0]
    assert measurements(k3, "kimi-k3", "h200", tmp_path) == []  # a slice is not the whole model
    consts = Constants.load()
    chip = get_chip("h200")
    bare = measured_side_by_side(rows, chip, "kimi-k3", workload_for_measurement({}), consts)
    looped = [dataclasses.replace(m, engine_loop=True) for m in rows]
    served = measured_side_by_side(looped, chip, "kimi-k3", workload_for_measurement({}), consts)
    for b, s in zip(bare, served):  # no engine host loop priced for a bare step, the rest the same
        assert s["predicted_ms_per_token"] - b["predicted_ms_per_token"] == pytest.approx(consts.step_overhead_us / 1e3)
    one, three = bare[2]["predicted_ms_per_token"], bare[1]["predicted_ms_per_token"]
    assert 1.0 < three / one < 3.0  # two more MoE layers on top of the dense one, embedding and head


@pytest.mark.parametrize(
    "model, layout",
    [
        ("llama-3.2-1b", ["--chip", "h100", "--chips", "1"]),
        ("k3-nano", ["--chip", "h100", "--chips", "1"]),
        ("kimi-k3", ["--chip", "b300", "--chips", "8", "--tp", "8"]),
    ],
)
def test_eager_on_an_accelerator_is_never_faster_than_captured_graphs(model, layout, capsys):
    """Eager runs the same host loop as a captured graph and launches more kernels (one per aten op)."""
    from nonstop.cli import main

    ms = {}
    for executor in ("kernels", "eager"):
        assert main(["plan", "-m", model, *layout, "--executor", executor, "--json"]) == 0
        ms[executor] = json.loads(capsys.readouterr().out)["ms_per_token"]
    assert ms["eager"] > ms["kernels"]


def test_the_cpu_matmul_peak_is_timed_in_thread_time_and_restores_the_pool():
    """Other processes on the cores must not make the peak look low: one thread's own CPU time."""
    from nonstop.plan.measured import matmul_tflops

    threads = torch.get_num_threads()
    matmul_tflops.cache_clear()
    peak = matmul_tflops()
    assert torch.get_num_threads() == threads and 0.001 < peak < 1000
