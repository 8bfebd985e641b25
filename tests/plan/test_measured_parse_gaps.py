"""How ``nonstop/plan/measured.py`` reads bench results into rows: each benchmark kind's fields, the chip
a result belongs to, and which results lend the cpu chip their bandwidth. Expected values are worked out
by hand from the synthetic result files written here."""

import json

import pytest

from nonstop.plan.measured import all_measurements, measurements, recorded_copy_gbps, this_cpu


def _write(tmp_path, name, data):
    (tmp_path / name).write_text(json.dumps(data))


def _cpu_decode(cpu: str) -> dict:
    return {
        "benchmark": "cpu_decode",
        "batch": 2,
        "dtype": "float32",
        "prompt_len": 10,
        "new_tokens": 20,
        "machine": {"threads": 3, "cpu": cpu},
        "bandwidth_floor": {"copy_GBps": 7.5},
        "results": {"nonstop_reference": {"decode_tokens_per_s": 50.0}},
    }


def test_cpu_decode_row_fields(tmp_path):
    """A ``cpu_decode`` result: ms per token = 1000 / tokens per s of one sequence, total = that times
    the batch, context = prompt + half the new tokens, and the run's copy bandwidth kept on the row."""
    _write(tmp_path, "a.json", _cpu_decode(this_cpu()))
    (m,) = all_measurements("cpu", tmp_path)
    assert m.ms_per_token == pytest.approx(20.0)
    assert m.tokens_per_s_total == pytest.approx(100.0)  # 50 tokens/s per sequence x batch 2
    assert (m.batch, m.threads, m.context) == (2, 3, 10 + 20 // 2)
    assert m.copy_gbps == 7.5 and m.cpu == this_cpu()


def test_spec_decode_rows_context_and_drafts(tmp_path):
    """A ``spec_decode`` result: the context is the longest held-out prompt plus half of max_tokens, the
    plain row runs at 1000 / tokens per s, a DSpark row keeps its draft count and accepted length."""
    data = {
        "benchmark": "spec_decode",
        "model": "k3-nano",
        "max_tokens": 40,
        "machine": {"cpu": this_cpu(), "threads": 1},
        "results": {
            "heldout": {
                "prompt_tokens": [30, 50, 20],
                "modes": {
                    "plain": {"decode_tokens_per_s": 25.0},
                    "dspark-k3": {"decode_tokens_per_s": 40.0, "mean_accepted_length": 2.5},
                },
            }
        },
    }
    _write(tmp_path, "s.json", data)
    plain, spec = all_measurements("cpu", tmp_path)
    assert plain.context == spec.context == 50 + 40 // 2
    assert plain.ms_per_token == pytest.approx(40.0) and plain.spec_draft is None
    assert (spec.ms_per_token, spec.spec_draft, spec.spec_accept) == (pytest.approx(25.0), 3, 2.5)
    assert plain.threads == 1


def _serve(serve_args: str) -> dict:
    return {
        "benchmark": "serve_load",
        "model": "k3-nano",
        "machine": {"cpu": this_cpu(), "server_threads": 2},
        "server": {"serve_args": serve_args},
        "load": {"clients": 4, "prompt_chars": 400, "max_tokens": 30},
        "results": {"tpot_s": {"p50": 0.05}, "output_tokens_per_s": 80.0},
    }


@pytest.mark.parametrize(
    "serve_args, batch, serial",
    [("--no-batch-invariant", 4, 1), ("", 1, 4)],
)
def test_serve_load_rows(tmp_path, serve_args, batch, serial):
    """A ``serve_load`` result: TPOT p50 in ms, context = prompt chars / 4 + half of max_tokens; a batched
    server runs the clients as one batch, a batch-invariant one runs them one after another (serial)."""
    _write(tmp_path, "l.json", _serve(serve_args))
    (m,) = all_measurements("cpu", tmp_path)
    assert m.ms_per_token == pytest.approx(50.0)
    assert m.tokens_per_s_total == 80.0
    assert m.context == 400 // 4 + 30 // 2
    assert (m.batch, m.serial, m.threads) == (batch, serial, 2)


def _decode(gpu: str, row: str = "superop", layers: int = 16) -> dict:
    rows = [{"row": row, "ms_per_token": 2.0}, {"row": "eager", "ms_per_token": 9.0}]
    slice_ = {"layers": layers, "timings": [{"context": 132, "rows": rows}]}
    return {
        "bench": "decode",
        "environment": {"gpu": gpu},
        "shapes": [{"shape": "llama-3.2-1b", "preset": "llama-3.2-1b", "full_layers": 16, "slices": [slice_]}],
    }


def test_gpu_megakernel_row_is_priced_as_the_megakernel(tmp_path):
    """A ``megakernel`` row of bench/decode.py is a megakernel run (the eager row is never read), a bare
    step on the device, of the whole model when the slice has every layer."""
    _write(tmp_path, "d.json", _decode("NVIDIA H100 80GB HBM3", row="megakernel"))
    (m,) = all_measurements("h100", tmp_path)
    assert (m.executor, m.engine_loop, m.model, m.hf_config) == ("megakernel", False, "llama-3.2-1b", None)
    assert m.ms_per_token == 2.0 and m.tokens_per_s_total == pytest.approx(500.0)


def test_a_gpu_result_is_no_cpu_measurement_and_lends_no_bandwidth(tmp_path):
    """A result taken on a GPU machine is neither a ``cpu`` chip row nor the cpu chip's bandwidth, even when
    recorded on this very CPU with a copy bandwidth."""
    data = _serve("")
    data["environment"] = {"gpu": "NVIDIA H100"}
    data["bandwidth_floor"] = {"copy_GBps": 123.0}
    _write(tmp_path, "g.json", data)
    assert all_measurements("cpu", tmp_path) == []
    assert recorded_copy_gbps(tmp_path) is None


def test_gpu_names_with_spaces_and_dashes_match_the_chip(tmp_path):
    """``environment.gpu`` is compared without spaces and dashes: "NVIDIA A 100" is an a100 run."""
    _write(tmp_path, "d.json", _decode("NVIDIA A 100-SXM4"))
    assert len(all_measurements("a100", tmp_path)) == 1


def test_a_named_model_row_belongs_to_that_model_only(tmp_path):
    """A row that names its model is this model's only under that name."""
    from nonstop.config import ModelConfig

    _write(tmp_path, "s.json", _serve(""))
    cfg = ModelConfig.preset("k3-nano")
    assert len(measurements(cfg, "k3-nano", "cpu", tmp_path)) == 1
    assert measurements(cfg, "kimi-k3", "cpu", tmp_path) == []


def test_cpu_entry_fills_this_machines_figures(monkeypatch):
    """The cpu chip's entry: memory in GB (not the bandwidth), bandwidth in GB/s, the per-op launch cost,
    the matmul peak as bf16 and fp32 (no fp8/fp4), and where the bandwidth came from; the catalogue's
    own entry is left as it was."""
    import nonstop.plan.measured as measured

    monkeypatch.setattr(measured, "_cpu_figures", lambda: (12.3456, 31.96, 0.5, 1.234, "bench/results/x.json"))
    base = {"key": "cpu", "sources": {"hbm_gbps": "catalogue"}}
    entry = measured.cpu_entry(base)
    assert (entry["hbm_gb"], entry["hbm_gbps"], entry["launch_us"]) == (32.0, 12.35, 1.23)
    assert entry["tflops"] == {"bf16": 0.5, "fp8": None, "fp4": None, "fp32": 0.5}
    assert entry["sources"]["hbm_gbps"].endswith("bench/results/x.json")
    assert base == {"key": "cpu", "sources": {"hbm_gbps": "catalogue"}}


@pytest.mark.parametrize(
    ("gpu", "chip", "matches"),
    [
        ("NVIDIA H200", "h20", False),
        ("NVIDIA H20", "h20", True),
        ("NVIDIA GB200", "b200", False),
        ("NVIDIA GB300", "b300", False),
        ("NVIDIA GB200", "gb200", True),
        ("NVIDIA GH200 480GB", "h200", False),
        ("NVIDIA H100-SXM5-80GB", "h100", True),
        ("NVIDIA H800 PCIe", "h800", True),
        ("AMD Instinct MI300X", "mi300x", True),
        ("AMD Instinct MI300X", "mi300", False),
    ],
)
def test_a_gpu_result_belongs_to_the_chip_its_name_spells_not_one_it_contains(tmp_path, gpu, chip, matches):
    """Results were matched to a chip by substring: ``nonstop plan --chip h20 --measured`` listed the H200 runs of
    bench/results as H20 measurements (and b200 took GB200 runs, b300 GB300 ones). A chip now matches only a
    run of whole words of the recorded GPU name."""
    _write(tmp_path, "d.json", _decode(gpu))
    assert len(all_measurements(chip, tmp_path)) == (1 if matches else 0)


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe{}",  # not UTF-8
        b"[1]",  # JSON, but no object
        b'"text"',
        json.dumps({"benchmark": "cpu_decode", "batch": 1}).encode(),  # no results
        json.dumps({**_cpu_decode("x"), "results": {"nonstop_reference": {"decode_tokens_per_s": 0}}}).encode(),
        json.dumps({"environment": {"gpu": 7}}).encode(),  # a GPU name that is no string
        json.dumps({"environment": "NVIDIA H100"}).encode(),
        json.dumps({**_decode("NVIDIA H100"), "shapes": [{"preset": "llama-3.2-1b", "slices": 3}]}).encode(),
    ],
)
@pytest.mark.parametrize("chip", ["cpu", "h100"])
def test_a_foreign_or_broken_result_file_is_skipped_not_fatal(tmp_path, content, chip):
    """One result file of another format in bench/results (not UTF-8, a JSON list, a row without its fields, a
    rate of 0) made every ``nonstop plan`` run fail - a UnicodeDecodeError, or an internal AttributeError,
    KeyError or ZeroDivisionError - on any chip. Such a file is now skipped; the good files beside it still
    count."""
    (tmp_path / "a_bad.json").write_bytes(content)
    _write(tmp_path, "b_cpu.json", _cpu_decode("x"))
    _write(tmp_path, "c_gpu.json", _decode("NVIDIA H100 80GB HBM3"))
    rows = all_measurements(chip, tmp_path)
    assert [m.source for m in rows] == ["b_cpu.json" if chip == "cpu" else "c_gpu.json"]
