"""``bench/decode.py``'s bookkeeping against hand-computed values: the correctness check's greedy agreement and
verdict, the extrapolation to the full depth, the table's floor and MBU cells, the failure count, the output
name and the --dry-run defaults."""

from __future__ import annotations

import math

import torch

from tests.bench_script import load_bench
from tests.runtime.helpers import tiny_model


class _Flip:
    """The reference as an executor, its greedy token moved to another one on every step (``flip``) or not."""

    def __init__(self, model, flip: bool):
        self.model, self.flip = model, flip

    def forward(self, ids, cache, batch, last_only=True):
        out = self.model(ids, cache, batch, last_only=last_only).float()
        if self.flip:
            top = out.argmax(-1)
            out[0, (top + 1) % out.shape[-1]] = out.abs().max() * 10
        return out


def test_correctness_greedy_agreement_is_a_fraction_and_fails_a_wrong_executor():
    """greedy_agreement = steps whose greedy tokens agree / steps (it was once the count); an executor whose greedy
    token differs every step agrees on 0% and fails the fp32 check."""
    bench = load_bench("decode.py")
    model = tiny_model("llama")
    with torch.inference_mode():
        same, _ = bench.correctness(model, _Flip(model, False), model.cfg, torch.float32, "cpu", 5, 3, 1)
        wrong, _ = bench.correctness(model, _Flip(model, True), model.cfg, torch.float32, "cpu", 5, 3, 1)
    assert same["greedy_agreement"] == 1.0 and same["max_rel_err"] == 0.0 and same["ok"]
    assert same["tolerance"] == 1e-3 and same["steps"] == 3
    assert wrong["greedy_agreement"] == 0.0 and wrong["max_rel_err"] > 1.0 and not wrong["ok"]


def _timing(context, nbytes, rows):
    return {"context": context, "bytes_read_per_token": nbytes, "rows": rows}


def test_extrapolate_by_hand():
    """3 layers at 2.0 ms / 500 B, 1 layer at 1.0 ms / 100 B, 27 layers in all: 0.5 ms and 200 B a layer,
    1 + 26 x 0.5 = 14 ms and 100 + 26 x 200 = 5300 B a token; a row missing on either side is left out."""
    result = {
        "full_layers": 27,
        "slices": [
            {"layers": 3, "timings": [_timing(12, 500, [{"row": "eager", "ms_per_token": 2.0}, {"row": "superop"}])]},
            {"layers": 1, "timings": [_timing(12, 100, [{"row": "eager", "ms_per_token": 1.0}, {"row": "superop"}])]},
        ],
    }
    (row,) = load_bench("decode.py").extrapolate(result)["rows"]
    assert row["row"] == "eager" and row["context"] == 12
    assert row["ms_per_layer"] == 0.5 and row["bytes_per_layer"] == 200.0
    assert row["full_ms_per_token"] == 14.0 and row["full_bytes_per_token"] == 5300.0
    assert math.isclose(row["full_achieved_GBps"], 5300 / 14e-3 / 1e9)  # bytes per second, in GB/s


def _report():
    timing = {
        "context": 12,
        "floor": {"floor_ms_per_token": 0.125, "floor_tokens_per_s": 8000.0, "copy_GBps": 100.0},
        "rows": [{"row": "eager", "ms_per_token": 0.5, "achieved_GBps": 25.0, "mbu": 0.25, "launches_per_step": 7}],
    }
    return {
        "bandwidth": {"copy_GBps": 100.0, "read_sum_GBps": 80.0},
        "spec_GBps": 3350,
        "shapes": [
            {
                "shape": "kimi-k3-slice",
                "full_layers": 61,
                "slices": [{"layers": 4, "timings": [timing]}],
                "extrapolation": {
                    "rows": [
                        {
                            "row": "eager",
                            "context": 12,
                            "ms_per_layer": 0.25,
                            "full_ms_per_token": 15.5,
                            "full_achieved_GBps": 40.0,
                        }
                    ]
                },
            }
        ],
    }


def test_table_prints_the_floor_and_mbu_beside_the_timing():
    """The floor row shows the floor's ms (not its tokens/s) at the copy bandwidth; an extrapolated row's MBU is
    its GB/s over the copy bandwidth (40 / 100 = 40.0%)."""
    text = load_bench("decode.py").table(_report())
    lines = text.splitlines()
    floor = next(x for x in lines if " floor " in x and x.startswith("kimi-k3-slice "))
    assert floor.split()[4:7] == ["0.1250", "100.0", "100.0%"], floor
    timed = next(x for x in lines if x.startswith("kimi-k3-slice ") and " eager " in x)
    assert timed.split()[4:8] == ["0.5000", "25.0", "25.0%", "7"], timed
    full = next(x for x in lines if x.startswith("kimi-k3-slice (full)"))
    assert full.split()[5:9] == ["15.5000", "40.0", "40.0%", "extrapolated,"], full
    assert "copy bandwidth 100 GB/s" in text and "spec 3350 GB/s" in text


def test_failures_count_by_hand():
    """A lost shape, a failed check, an erred check and an erred row count; a skipped row and a passed check do
    not."""
    bench = load_bench("decode.py")
    rows = [{"row": "eager", "error": "x"}, {"row": "superop", "skipped": "time budget"}, {"row": "megakernel"}]
    report = {
        "shapes": [
            {"shape": "a", "error": "OutOfMemoryError"},
            {
                "shape": "b",
                "slices": [
                    {"check": {"ok": False}, "check_megakernel": {"error": "x"}, "timings": [{"rows": rows}]},
                    {"check": {"ok": True}, "timings": [{"rows": rows[1:]}]},
                ],
            },
        ]
    }
    assert bench._failures(report) == 4


def test_output_name():
    """decode_<gpu>.json for all shapes, the shapes appended for a subset, cpu-tiny for a tiny CPU run."""
    bench = load_bench("decode.py")
    gpu = {"gpu": "NVIDIA H200"}
    assert bench.output_name(gpu, False, list(bench.SHAPES)) == "decode_nvidia-h200.json"
    assert bench.output_name(gpu, False, ["kimi-k3-slice"]) == "decode_nvidia-h200-kimi-k3-slice.json"
    assert bench.output_name({}, True, list(bench.SHAPES)) == "decode_cpu-tiny.json"
    assert bench.output_name({}, False, list(bench.SHAPES)) == "decode_cpu.json"


def test_dry_run_defaults_and_explicit_values():
    """--dry-run: 5 steps, 1 warmup, 12 tokens of context, a 16 MiB copy, 1 thread, the twins, no time budget,
    rows superop, megakernel, eager; values the user gives are kept."""
    bench = load_bench("decode.py")
    args = bench.parse_args(["--dry-run", "--no-gpucheck"])
    got = (args.steps, args.warmup, args.context, args.copy_bytes, args.threads, args.kernels, args.budget_s)
    assert got == (5, 1, 12, 1 << 24, 1, False, math.inf)
    assert args.rows == ["superop", "megakernel", "eager"] and args.device == "cpu" and args.tiny
    args = bench.parse_args(["--dry-run", "--steps", "7", "--warmup", "0", "--context", "9", "--threads", "2"])
    assert (args.steps, args.warmup, args.context, args.threads) == (7, 0, 9, 2)


def test_the_report_is_written_only_where_told_in_a_tiny_run(tmp_path, monkeypatch):
    """A --tiny run writes --out and $OUT only (never bench/results); $OUT gets the generated name."""
    import argparse

    bench = load_bench("decode.py")
    monkeypatch.setenv("OUT", str(tmp_path / "o"))
    report = {"environment": {}, "x": 1}
    args = argparse.Namespace(out=None, tiny=True, shapes=["llama-3.2-1b"])
    assert bench.write(report, args) == [str(tmp_path / "o" / "decode_cpu-tiny-llama-3-2-1b.json")]


class _Shift:
    """The reference as an executor, one logit moved by ``shift`` x the largest."""

    def __init__(self, model, shift: float):
        self.model, self.shift = model, shift

    def forward(self, ids, cache, batch, last_only=True):
        out = self.model(ids, cache, batch, last_only=last_only).float()
        out[..., 0] += self.shift * out.abs().max()
        return out


def test_a_bf16_check_within_the_tolerance_passes_beyond_the_floor():
    """A bf16 check passes within 5e-2 of the bf16 reference OR within twice the fp32 floor: an executor 3e-2 off
    the reference (beyond twice this model's floor of ~3e-3) passes on the tolerance (it failed when both were
    required)."""
    bench = load_bench("decode.py")
    model = tiny_model("llama", dtype=torch.bfloat16)
    with torch.inference_mode():
        check, _ = bench.correctness(
            model, _Shift(model, 0.03), model.cfg, torch.bfloat16, "cpu", 7, 3, 11, bench.fp32_truth(model)
        )
    assert check["tolerance"] == 5e-2 and check["max_rel_err"] < 5e-2
    assert not check["within_floor"] and check["ok"], check


def test_a_row_s_bandwidth_mbu_and_floor_by_hand(monkeypatch):
    """Each timed row: GB/s = bytes read per token / ms / 1e6 (bytes per ms to GB/s), weight GB/s likewise of the
    weight bytes, MBU = GB/s / copy GB/s; the floor = bytes read per token at the copy bandwidth. A step timed at
    2 ms, with a copy bandwidth of 0.01 GB/s (10 MB/s): catches a GB/s in the wrong unit, weight bytes taken for
    bytes read, and MBU multiplied by the copy bandwidth."""
    bench = load_bench("decode.py")

    class Clock:
        cuda = False

        def __init__(self, device):
            pass

        def time_steps(self, step, steps, warmup):
            step()
            return {"ms_per_token": 2.0, "steps": steps, "warmup": warmup}

    monkeypatch.setattr(bench, "Clock", Clock)
    args = bench.parse_args(
        ["--dry-run", "--no-gpucheck", "--rows", "eager", "--shapes", "llama-3.2-1b", "--llama-layers", "1"]
    )
    copy = 0.01
    shape = bench.run_shape("llama-3.2-1b", args, torch.device("cpu"), torch.float32, bench.Budget(1e9), copy)
    (timing,) = shape["slices"][0]["timings"]
    read, weights = timing["bytes_read_per_token"], timing["weight_bytes_per_token"]
    assert read > weights > 0  # the cache is read too: the two counts differ
    (row,) = timing["rows"]
    assert math.isclose(row["achieved_GBps"], read / 2e-3 / 1e9)
    assert math.isclose(row["weight_GBps"], weights / 2e-3 / 1e9)
    assert math.isclose(row["mbu"], read / 2e-3 / 1e9 / copy)
    floor = timing["floor"]
    assert floor["bytes_per_token"] == read and floor["copy_GBps"] == copy
    assert math.isclose(floor["floor_ms_per_token"], read / (copy * 1e9) * 1e3, abs_tol=1e-3)


def test_only_a_partial_slice_of_more_than_one_layer_is_extrapolated(monkeypatch):
    """A model timed at its full depth is not extrapolated (no 1-layer slice timed beside it), nor is a 1-layer
    slice (per layer = (t_N - t_1) / (N - 1) has no N - 1)."""
    bench = load_bench("decode.py")
    monkeypatch.setattr(bench, "time_rows", lambda *a: [])  # the slices alone, untimed
    for layers, slices in (("16", 1), ("1", 1), ("2", 2)):
        args = bench.parse_args(
            ["--dry-run", "--no-gpucheck", "--rows", "eager", "--shapes", "llama-3.2-1b", "--llama-layers", layers]
        )
        shape = bench.run_shape("llama-3.2-1b", args, torch.device("cpu"), torch.float32, bench.Budget(1e9), 1.0)
        assert [s["layers"] for s in shape["slices"]] == [int(layers), 1][:slices], layers
        assert ("extrapolation" in shape) == (slices == 2)
