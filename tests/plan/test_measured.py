"""nonstop's own CPU measurements beside the planner (``nonstop/plan/measured.py``): the cpu chip's
figures come from this machine, so results recorded on another CPU are labelled and never lend it their
bandwidth."""

import json

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
