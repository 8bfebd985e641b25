"""Gaps a mutation audit of the planner's periphery found: chip-file validation, release formats, serving
format bytes, the layout search's candidates and quick bound, the report's tables and the measured side-by-side.
Every expected value is hand arithmetic from the chip catalogue's figures, a model's config.json, the
format definitions (OCP MX: an E8M0 scale per 32 values; NVFP4: an fp8 scale per 16; fp8 128x128 blocks of
fp32 scales) or docs/plan.md."""

from __future__ import annotations

import dataclasses
import json

import pytest

from nonstop.cli import main
from nonstop.config import ModelConfig, preset_hf_dict
from nonstop.plan.chips import ChipError, chip_from_entry, get_chip, load_catalogue
from nonstop.plan.layout import Layout
from nonstop.plan.workload import Precision, build_workload, serving_format

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _refused(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(["plan", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("nonstop: error:"), err
    return err


def _h200() -> dict:
    return json.loads(json.dumps(load_catalogue()["h200"]))


@pytest.fixture(scope="module")
def llama():
    return build_workload(ModelConfig.preset("llama-3.2-1b"), "llama-3.2-1b")


@pytest.fixture(scope="module")
def nano():
    return build_workload(ModelConfig.preset("k3-nano"), "k3-nano")


# ----------------------------------------------------------------------------- chip entries


@pytest.mark.parametrize("path", ["hbm_gbps", "launch_us", "scale_up.latency_us", "tflops.bf16"])
def test_a_zero_figure_is_refused(path):
    """docs/plan.md: a figure must be positive and finite; zero is neither a bandwidth nor a latency."""
    entry = _h200()
    *outer, last = path.split(".")
    (entry[outer[0]] if outer else entry)[last] = 0
    with pytest.raises(ChipError, match=f"{path} must be a positive finite number"):
        chip_from_entry("x1", entry)


@pytest.mark.parametrize(("ratio", "ok"), [(0.89, False), (0.91, True), (1.11, True), (1.13, False), (1.3, False)])
def test_the_driver_capacity_must_lie_within_0_9_and_1_12_of_the_sold_one(ratio, ok):
    """docs/plan.md: the loader refuses a driver figure outside 0.9-1.12x the sold one."""
    entry = _h200()
    entry["hbm_visible_gb"] = entry["hbm_gb"] * ratio
    if ok:
        assert chip_from_entry("x1", entry).hbm_bytes == pytest.approx(entry["hbm_gb"] * ratio * 1e9)
    else:
        with pytest.raises(ChipError, match="is far from hbm_gb"):
            chip_from_entry("x1", entry)


def test_an_optional_tensor_peak_needs_its_source_too():
    entry = _h200()
    del entry["sources"]["tflops.fp8"]
    with pytest.raises(ChipError, match="tflops.fp8 has no source"):
        chip_from_entry("x1", entry)


def test_a_chip_files_cpu_entry_is_validated_and_listed(tmp_path, capsys):
    """A file's cpu entry replaces the measured one, so --list-chips validates and shows it."""
    entry = _h200()
    entry.update(name="my cpu box", kind="cpu", hbm_gb=64, executor="eager")
    del entry["hbm_visible_gb"]
    path = tmp_path / "chips.json"
    path.write_text(json.dumps({"cpu": entry}))
    assert main(["plan", "--list-chips", "--json", "--chip-file", str(path)]) == 0
    listed = json.loads(capsys.readouterr().out)["cpu"]
    assert listed["name"] == "my cpu box" and listed["hbm_gb"] == 64
    path.write_text(json.dumps({"cpu": {**entry, "hbm_gbps": -5}}))
    err = _refused(capsys, "--list-chips", "--chip-file", str(path))
    assert "'cpu'" in err and "hbm_gbps must be a positive finite number" in err


# ----------------------------------------------------------------------------- releases


def test_kimi_k27_code_is_priced_with_int4_experts_and_bf16_elsewhere():
    """releases.py: K2.7 Code has int4 MoE weights and bf16 everything else, as K2.6."""
    from nonstop.plan.releases import model_ref, release_formats
    from nonstop.weights.resolve import resolve_model

    cfg, _ = resolve_model(model_ref("moonshotai/Kimi-K2.7-Code"))
    prec = Precision.released(cfg, **release_formats("moonshotai/Kimi-K2.7-Code"))
    assert (prec.dense, prec.experts, prec.cache) == ("bf16", "int4", "bf16")


def test_an_unknown_bare_model_name_is_one_line(capsys):
    err = _refused(capsys, "-m", "no-such-model-xyz", "--chip", "h100")
    assert "'no-such-model-xyz'" in err and "planner models and releases" in err


# ----------------------------------------------------------------------------- serving formats


def _llama_matrix_params() -> int:
    """Llama 3.2 1B's matrices outside the (tied) embedding: q / k / v / o and gate / up / down per layer."""
    c = preset_hf_dict("llama-3.2-1b")
    h, hd = c["hidden_size"], c["head_dim"]
    attention = h * hd * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    return c["num_hidden_layers"] * (attention + 3 * h * c["intermediate_size"])


@pytest.mark.parametrize(
    ("fmt", "per_param"),
    [("nvfp4", 0.5 + 1 / 16), ("mxfp4", 0.5 + 1 / 32), ("fp4", 0.5 + 1 / 32), ("fp8", 1 + 4 / (128 * 128))],
)
def test_quantised_dense_weights_weigh_their_block_scales(llama, fmt, per_param):
    """Against bf16, only the layers' matrices change (the tied embedding / head stays bf16): by
    (2 - bytes per param) each. NVFP4: 4 bits + an fp8 scale per 16; MXFP4 (also spelled fp4): 4 bits + an
    E8M0 scale per 32; fp8: 1 byte + an fp32 scale per 128x128 block."""
    quantised = build_workload(llama.cfg, "llama-3.2-1b", Precision(dense=serving_format(fmt)))
    saved = llama.total_weight_bytes() - quantised.total_weight_bytes()
    assert saved == pytest.approx(_llama_matrix_params() * (2 - per_param), rel=1e-9)


@pytest.mark.parametrize("alias", ["fp16", "float16", "FP16", "bfloat16"])
def test_half_precision_spellings_are_two_bytes(alias):
    assert serving_format(alias) == "bf16"


def test_an_fp8_kv_cache_halves_the_cache_and_adds_its_scales(llama):
    """Llama 3.2 1B caches K and V of 8 heads of 64 in each of 16 layers: 16 x 2 x 8 x 64 = 16,384 values a
    token, 32,768 B in bf16 and 16,384 x (1 + 4 / 128^2) = 16,388 B in fp8."""
    c = preset_hf_dict("llama-3.2-1b")
    values = c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * c["head_dim"]
    assert values == 16384
    assert llama.cache_bytes_per_token() == pytest.approx(2 * values)
    fp8 = build_workload(llama.cfg, "llama-3.2-1b", Precision(cache="fp8"))
    assert fp8.cache_bytes_per_token() == pytest.approx(16388)


# ----------------------------------------------------------------------------- the layout search


def test_the_search_tries_every_split_of_8_ranks_up_to_8_stages(llama):
    """search.py: pp in 1, 2, 4, 8, tp over the divisors of a stage (Llama's 32 query / 8 KV heads split
    1 to 8 ways), dp the rest; a dense model has no expert placement: 4 + 3 + 2 + 1 layouts."""
    from nonstop.plan.search import candidate_layouts

    got = {(lay.tp, lay.dp, lay.ep, lay.pp) for lay in candidate_layouts(llama, 8)}
    want = {(tp, 8 // pp // tp, 1, pp) for pp in (1, 2, 4, 8) for tp in (1, 2, 4, 8) if tp <= 8 // pp}
    assert got == want and len(want) == 10


def test_the_search_counts_ranks_not_chips_on_two_device_chips(nano):
    """docs/plan.md: layout sizes count ranks; 2 TPU7x chips are 4 ranks, and every candidate uses them all."""
    from nonstop.plan.search import search

    cands = search(nano, get_chip("tpu-v7"), 2, batch=1, context=64)
    assert cands and {c.layout.world for c in cands} == {4}
    assert any(c.layout.tp == 4 for c in cands)


def test_the_quick_bound_holds_the_experts_of_the_ranks_that_share_them(nano):
    """TP1 DP4 EP2: whole experts spread over 2 ranks, so a rank holds at least half of them (the search
    must not divide them by all 4 ranks of the layout)."""
    from nonstop.plan.search import lower_bound_bytes

    experts = sum(op.expert.bytes_each * op.expert.num_experts for op in nano.moe_ops)
    assert experts > 0
    dense = sum(op.weight_bytes for op in nano.ops)  # TP1: every rank streams all of them
    bound = lower_bound_bytes(nano, Layout(1, 4, 2), 1, 0)
    assert bound >= dense + experts / 2


def test_the_search_drops_on_a_ranks_capacity_not_a_chips(nano):
    """On a chip of two devices the quick bound is compared with one rank's share: a layout whose bound lies
    between a rank's and a chip's usable bytes is dropped unpredicted."""
    from nonstop.plan.predict import USABLE_HBM
    from nonstop.plan.search import candidate_layouts, lower_bound_bytes, search

    bounds = sorted(lower_bound_bytes(nano, lay, 1, 64) for lay in candidate_layouts(nano, 2))
    lo, hi = bounds[0], bounds[-1]
    assert hi > 1.5 * lo  # TP1 DP2 holds all the dense weights, TP2 half
    rank_capacity = (lo + hi) / 2  # the smallest layout's bound fits a rank, the largest's does not
    chip = dataclasses.replace(
        get_chip("h100"), devices_per_chip=2, hbm_gb=2 * rank_capacity / USABLE_HBM / 1e9, hbm_visible_gb=None
    )
    assert chip.rank_hbm_bytes * USABLE_HBM == pytest.approx(rank_capacity)
    cands = search(nano, chip, 1, batch=1, context=64)
    assert any(c.fits for c in cands)
    dropped = [c for c in cands if lower_bound_bytes(nano, c.layout, 1, 64) > rank_capacity]
    assert dropped and all(c.bytes_per_rank <= 2 * rank_capacity for c in dropped)  # each would fit a chip
    for c in dropped:
        assert c.prediction is None and not c.fits, c.layout.describe()


# ----------------------------------------------------------------------------- the report


def test_the_layout_table_shows_top_rows(nano):
    from nonstop.plan.report import layout_table
    from nonstop.plan.search import search

    chip = get_chip("h100")
    cands = search(nano, chip, 2, batch=1, context=64)
    assert len(cands) > 2
    for top in (1, 2):
        assert len(layout_table(cands, top, chip).splitlines()) == 1 + top  # the header and top rows


def test_tokens_per_chip_divide_by_chips_not_ranks(nano):
    """TP4 on TPU7x is 4 ranks on 2 chips (two TensorCores each)."""
    from nonstop.plan.predict import predict
    from nonstop.plan.report import describe

    p = predict(nano, get_chip("tpu-v7"), Layout(4), 1, 64)
    assert p.chips == 2
    assert f"({p.tokens_per_s_total / 2:.1f} per chip)" in describe(p)


def test_time_to_first_token_is_reported_from_two_requests_on(nano):
    """The mean TTFT of a wave and its stall mean something for any batch above one."""
    from nonstop.plan.predict import Requests, predict
    from nonstop.plan.report import describe

    requests = Requests(64, 16)
    for batch, shown in ((1, False), (2, True), (3, True)):
        text = describe(predict(nano, get_chip("h100"), Layout(), batch, requests.context, requests=requests))
        assert ("time to first token" in text) is shown and ("their prefills" in text) is shown, batch


# ----------------------------------------------------------------------------- the measured side-by-side


def _measurement(**kw):
    from nonstop.plan.measured import Measurement

    base = dict(source="x.json", what="run", batch=1, dtype="float32", ms_per_token=10.0, tokens_per_s_total=100.0)
    return Measurement(**{**base, "model": "k3-nano", **kw})


def _side(rows, chip="h100"):
    from nonstop.plan.report import measured_side_by_side, workload_for_measurement

    return measured_side_by_side(rows, get_chip(chip), "k3-nano", workload_for_measurement({}))


def test_a_batch_invariant_servers_clients_wait_for_each_other():
    """A server stepping one sequence at a time serves each of 3 clients every third step: 3x the step."""
    one, three = _side([_measurement(executor="kernels"), _measurement(executor="kernels", serial=3)])
    assert three["predicted_ms_per_token"] == pytest.approx(3 * one["predicted_ms_per_token"])


def test_a_cpu_run_is_predicted_at_the_bandwidth_it_measured():
    (row,) = _side([_measurement(executor="kernels", copy_gbps=12.5)])
    assert row["prediction"].chip.hbm_gbps == 12.5


def test_a_measured_runs_quantised_experts_keep_their_format():
    """K3's routed experts are stored in MXFP4: a float32 run keeps them so and runs the rest in fp32."""
    from nonstop.plan.measured import Measurement
    from nonstop.plan.report import workload_for_measurement

    hf = ModelConfig.preset("kimi-k3").with_num_layers(2).to_hf_dict()
    m = Measurement("x.json", "run", 1, "float32", 10.0, 100.0, hf_config=hf)
    prec = workload_for_measurement({})(m).precision
    assert (prec.dense, prec.experts) == ("fp32", "mxfp4")


def _write(tmp_path, name, data):
    (tmp_path / name).write_text(json.dumps(data))


def _cpu_decode(**kw) -> dict:
    data = {
        "benchmark": "cpu_decode",
        "batch": 1,
        "dtype": "float32",
        "prompt_len": 32,
        "new_tokens": 100,
        "machine": {"threads": 2},
        "results": {"nonstop_reference": {"decode_tokens_per_s": 20.0}},
    }
    return {**data, **kw}


def test_a_cpu_decode_runs_mean_context_is_the_prompt_and_half_the_new_tokens(tmp_path):
    from nonstop.plan.measured import all_measurements

    _write(tmp_path, "cpu_decode.json", _cpu_decode())
    (m,) = all_measurements("cpu", tmp_path)
    assert (m.context, m.ms_per_token, m.tokens_per_s_total) == (32 + 100 // 2, 50.0, 20.0)


def test_a_spec_decode_runs_context_is_its_longest_prompt_and_half_its_tokens(tmp_path):
    from nonstop.plan.measured import all_measurements

    modes = {"plain": {"decode_tokens_per_s": 25.0}}
    data = {"benchmark": "spec_decode", "model": "k3-nano", "max_tokens": 64, "machine": {"threads": 1}}
    data["results"] = {"heldout": {"prompt_tokens": [10, 48, 20], "modes": modes}}
    _write(tmp_path, "spec.json", data)
    (m,) = all_measurements("cpu", tmp_path)
    assert (m.context, m.ms_per_token) == (48 + 32, 40.0)


@pytest.mark.parametrize(("serve_args", "batch", "serial"), [("--no-batch-invariant", 4, 1), ("", 1, 4)])
def test_a_serve_load_run_is_batched_or_serial_as_the_server_ran(tmp_path, serve_args, batch, serial):
    from nonstop.plan.measured import all_measurements

    data = {
        "benchmark": "serve_load",
        "model": "k3-nano",
        "server": {"serve_args": serve_args},
        "machine": {"server_threads": 2},
        "load": {"clients": 4, "prompt_chars": 200, "max_tokens": 64},
        "results": {"tpot_s": {"p50": 0.05}, "output_tokens_per_s": 60.0},
    }
    _write(tmp_path, "serve.json", data)
    (m,) = all_measurements("cpu", tmp_path)
    assert (m.batch, m.serial, m.context, m.ms_per_token) == (batch, serial, 200 // 4 + 64 // 2, 50.0)


def test_a_run_on_a_gpu_machine_is_no_cpu_measurement(tmp_path):
    from nonstop.plan.measured import all_measurements

    _write(tmp_path, "gpu.json", _cpu_decode(environment={"gpu": "NVIDIA H200"}))
    assert all_measurements("cpu", tmp_path) == []


def test_the_cpu_chip_takes_the_newest_bandwidth_of_this_cpu(tmp_path):
    from nonstop.plan.measured import recorded_copy_gbps, this_cpu

    for name, gbps, time in (("a.json", 30.0, "2026-06-01T00:00:00"), ("b.json", 10.0, "2026-01-01T00:00:00")):
        data = _cpu_decode(time=time, bandwidth_floor={"copy_GBps": gbps}, machine={"cpu": this_cpu(), "threads": 2})
        _write(tmp_path, name, data)
    assert recorded_copy_gbps(tmp_path) == (30.0, "a.json")


def test_a_gpu_megakernel_row_is_priced_as_the_megakernel(tmp_path):
    from nonstop.plan.measured import all_measurements

    rows = [{"row": "superop", "ms_per_token": 2.0}, {"row": "megakernel", "ms_per_token": 1.0}]
    timing = {"context": 132, "rows": rows}
    shape = {"preset": "llama-3.2-1b", "full_layers": 16, "slices": [{"layers": 16, "timings": [timing]}]}
    _write(tmp_path, "decode.json", {"bench": "decode", "environment": {"gpu": "NVIDIA H200"}, "shapes": [shape]})
    got = [(m.ms_per_token, m.executor) for m in all_measurements("h200", tmp_path)]
    assert got == [(2.0, "kernels"), (1.0, "megakernel")]


def test_the_cpu_matmul_peak_counts_every_thread(monkeypatch):
    """One thread's best 512^3 product (2 x 512^3 FLOPs) in 1 ms of its own CPU time is 0.268 TFLOP/s; the
    machine's peak is that times the threads torch runs."""
    import torch

    from nonstop.plan import measured

    clock = iter(i * 1e-3 for i in range(1000))
    monkeypatch.setattr(measured.time, "thread_time", lambda: next(clock))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        measured.matmul_tflops.cache_clear()
        assert measured.matmul_tflops() == pytest.approx(2 * 2 * 512**3 / 1e-3 / 1e12)
    finally:
        torch.set_num_threads(threads)
        measured.matmul_tflops.cache_clear()


# ----------------------------------------------------------------------------- published points


def test_a_point_without_a_context_means_the_same_on_the_command_line_and_in_the_table():
    """points.plan_argv and validation.predict_point read one point alike (test_heldout checks that for the
    published points, which all state their context)."""
    from nonstop.plan.points import plan_argv
    from nonstop.plan.validation import predict_point

    point = {"id": "t", "model": "k3-nano", "chip": "h100", "chips": 1, "batch": 1, "metric": "ms_per_token"}
    argv = plan_argv(point)
    assert argv[argv.index("--context") + 1] == str(predict_point(point).context)
    assert argv[argv.index("--sharding") + 1] == predict_point(point).layout.sharding


def test_the_stalls_what_if_recomputes_every_throughput_from_the_stalled_token():
    """10 ms a token plus a 2.5 ms stall is 12.5 ms: 80 tokens/s a user, x 8 users = 640, over 4 chips 160."""
    from nonstop.plan.points import metric_value

    result = {"ms_per_token": 10.0, "prefill_stall_ms_per_token": 2.5, "chips": 4}
    want = {"ms_per_token": 12.5, "tokens_per_s_per_user": 80.0, "tokens_per_s_total": 640.0}
    want["tokens_per_s_per_chip"] = 160.0
    for metric, value in want.items():
        point = {"id": "t", "metric": metric, "batch": 8, "stalls": True}
        assert metric_value(result, point, with_stalls=True) == pytest.approx(value), metric
        assert metric_value({**result, metric: 1.0}, point) == 1.0  # without stalls: the decode figure as is


def test_a_points_precision_overrides_its_releases_formats(monkeypatch):
    """As on the command line, where --experts overrides what a release stores."""
    from nonstop.plan import validation

    monkeypatch.setattr(validation, "build_workload", lambda cfg, name, precision: precision)
    prec = validation._workload.__wrapped__("nvidia/Kimi-K3-NVFP4", (("experts", "mxfp4"),))
    assert prec.experts == "mxfp4"
    assert validation._workload.__wrapped__("nvidia/Kimi-K3-NVFP4", ()).experts == "nvfp4"


def test_a_time_to_first_token_points_bound_is_its_prefills():
    """An 8,000-token prompt of Llama 3.2 1B on an H100 is a compute-bound step; its one-row decode is not."""
    from nonstop.plan.validation import evaluate

    point = {"id": "t", "model": "llama-3.2-1b", "chip": "h100", "chips": 1, "batch": 1, "metric": "prefill_ms"}
    point.update(input_len=8000, output_len=8, published=1.0, role="heldout")
    (row,) = evaluate([point])
    assert row.bound == row.prediction.prefill.bound() == "compute"
    assert row.prediction.time.bound() != "compute"


# ----------------------------------------------------------------------------- check_layout


def _check(workload, layout):
    from nonstop.plan.layout import check_layout
    from nonstop.plan.workload import PlanError

    with pytest.raises(PlanError) as e:
        check_layout(workload, layout)
    return str(e.value)


def test_more_stages_than_layers_are_refused(nano):
    layers = nano.cfg.num_hidden_layers
    assert f"--pp {layers + 1} exceeds the {layers} layers" in _check(nano, Layout(pp=layers + 1))


def test_more_expert_ranks_than_experts_are_refused(nano):
    n = nano.moe_ops[0].expert.num_experts
    assert f"--ep {2 * n} exceeds the {n} routed experts" in _check(nano, Layout(1, 2 * n, 2 * n))


def test_expert_parallel_on_a_dense_model_is_refused(llama):
    assert "has no routed experts: --ep must be 1" in _check(llama, Layout(1, 2, 2))


def test_decode_context_parallel_needs_an_attention_cache():
    """Every layer KDA: no cached tokens to split."""
    from tests.tiny_configs import KIMI_LINEAR_LAYER_TYPES

    raw = {**KIMI_LINEAR_LAYER_TYPES, "layer_types": ["linear_attention"] * len(KIMI_LINEAR_LAYER_TYPES["layer_types"])}
    workload = build_workload(ModelConfig.from_hf_dict(raw), "all-kda")
    assert workload.cache_bytes_per_token() == 0
    assert "keeps no attention cache to split: --dcp must be 1" in _check(workload, Layout(2, dcp=2))


# ----------------------------------------------------------------------------- flags


def test_spec_draft_is_capped_at_64_exactly(capsys):
    """--help: tokens K drafted per step, 1 to 64."""
    argv = ["-m", "k3-nano", "--chip", "h100", "--chips", "1", "--tp", "1", "--spec-accept", "2", "--json"]
    assert main(["plan", *argv, "--spec-draft", "64"]) == 0
    assert json.loads(capsys.readouterr().out)["spec"]["drafts"] == 64
    assert "--spec-draft 65" in _refused(capsys, *argv, "--spec-draft", "65")


def test_spec_draft_without_spec_accept_is_refused(capsys):
    err = _refused(capsys, "-m", "k3-nano", "--chip", "h100", "--chips", "1", "--spec-draft", "4")
    assert "--spec-draft needs --spec-accept" in err


def test_the_fewest_chips_search_stops_at_the_chips_max_chips(tmp_path, capsys):
    """A chip that plans at most 3 chips tries 1 and 2 of the counts 1, 2, 4, ... (4 is more than it may use)."""
    entry = _h200()
    entry.update(hbm_gb=0.001, max_chips=3)  # 1 MB: k3-nano fits no count
    del entry["hbm_visible_gb"]
    entry["sources"]["max_chips"] = "test figure"
    path = tmp_path / "chips.json"
    path.write_text(json.dumps({"x1": entry}))
    assert main(["plan", "-m", "k3-nano", "--chip", "x1", "--chip-file", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["chips_tried"] == [1, 2] and not out["fits"]
    # layouts dropped on the quick bound say so (no ms/token); those predicted in full give exact bytes
    assert any(lay["bytes_is_lower_bound"] for lay in out["layouts"])
    for lay in out["layouts"]:
        assert lay["bytes_is_lower_bound"] is (lay["ms_per_token"] is None)


def test_the_cpu_chip_plans_fp32_but_keeps_quantised_experts_as_stored():
    """docs/plan.md: plans on cpu default to fp32 weights; K3's MXFP4 experts are not widened."""
    import argparse

    from nonstop.commands.plan import _precision

    cpu = dataclasses.replace(get_chip("h100"), kind="cpu")
    args = argparse.Namespace(model="kimi-k3", weights=None, experts=None, attention=None, cache=None)
    k3 = ModelConfig.preset("kimi-k3").with_num_layers(2)
    prec = _precision(args, k3, cpu)
    assert (prec.dense, prec.experts, prec.cache) == ("fp32", "mxfp4", "bf16")
    nano_prec = _precision(argparse.Namespace(**{**vars(args), "model": "k3-nano"}), ModelConfig.preset("k3-nano"), cpu)
    assert (nano_prec.dense, nano_prec.experts) == ("fp32", "fp32")


def test_a_tp_and_dp_that_do_not_make_the_ranks_are_refused(capsys):
    base = ["-m", "k3-nano", "--chip", "h100", "--chips", "8"]
    assert "--tp 8 x --dp 8 = 64 ranks, not the 8 ranks" in _refused(capsys, *base, "--tp", "8", "--dp", "8")
    assert "--tp 2 x --dp 2 = 4 ranks, not the 8 ranks" in _refused(capsys, *base, "--tp", "2", "--dp", "2")


def test_search_json_sizes_every_layout_per_chip_on_two_device_chips(capsys):
    """TPU7x: a chip is two ranks, so a layout's bytes_per_chip is twice its rank's, as the best layout's."""
    assert main(["plan", "-m", "k3-nano", "--chip", "tpu-v7", "--chips", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    best = out["layouts"][0]
    assert best["fits"] and best["bytes_per_chip"] == pytest.approx(out["bytes_per_chip"])
    assert out["layout"]["devices_per_chip"] == 2


def test_the_header_names_the_chip_counts_tried():
    """docs/plan.md: "1", "1 or 2", "1, 2, 4", "1, 2, 4, ... 512"."""
    from nonstop.commands.plan import FEWEST_CHIPS, _counts

    assert _counts([1]) == "1"
    assert _counts([1, 2]) == "1 or 2"
    assert _counts([1, 2, 4]) == "1, 2, 4"
    assert _counts(list(FEWEST_CHIPS)) == "1, 2, 4, ... 512"


def test_list_chips_prints_the_drivers_capacity(capsys):
    """docs/plan.md: --list-chips prints the driver's figure (an H200 sold as 141 GB: 150.8 GB)."""
    from nonstop.plan.chips import CATALOGUE

    visible = json.loads(CATALOGUE.read_text())["h200"]["hbm_visible_gb"]
    assert visible > 141
    assert main(["plan", "--list-chips"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("h200 ")]
    assert f" {visible:.1f} " in row and " 141.0 " not in row


def test_a_step_the_drafter_dominates_is_called_draft_bound():
    """``bound()`` left the draft time out: a step whose largest part is the speculative drafter's own
    forward was labelled by the next largest part (here bandwidth), which sends a user to tune the wrong thing."""
    from nonstop.plan.timing import StepTime

    assert StepTime(weights_ms=2.0, compute_ms=0.5, draft_ms=3.0).bound() == "speculative draft"
    assert StepTime(weights_ms=2.0, compute_ms=0.5, draft_ms=1.0).bound() == "HBM bandwidth (weights)"
