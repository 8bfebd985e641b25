"""``bench/decode.py`` runs end to end on a CPU (--dry-run: narrow twins, the twins as superop, the
megakernel under Triton's interpreter) and writes a report with every row timed, the correctness
checks passed and the launches counted."""

from __future__ import annotations

import json

import pytest
import torch

from nonstop.cache.pages import PAGE_SIZE
from nonstop.hostinfo import environment
from tests.bench_script import load_bench
from tests.runtime.helpers import tiny_model


def _bench():
    return load_bench("decode.py")


def test_dry_run_writes_a_complete_report(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OUT", raising=False)
    out = tmp_path / "decode.json"
    bench = _bench()
    check_steps = 2
    context = PAGE_SIZE - check_steps  # the timed step is the first token of a new cache page: it reserves one
    bench.main(
        [
            "--dry-run",
            "--shapes",
            "llama-3.2-1b,kimi-linear-48b-a3b",
            "--llama-layers",
            "2",
            "--kimi-linear-layers",
            "2",
            "--steps",
            "3",
            "--context",
            str(context),
            "--check-steps",
            str(check_steps),
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert report["status"] == "complete" and report["bandwidth"]["copy_GBps"] > 0
    assert report["environment"].keys() == environment().keys()  # the machine as hostinfo records it
    llama, kimi = report["shapes"]
    for shape in (llama, kimi):
        for sl in shape["slices"]:
            assert sl["check"]["ok"], sl["check"]
            assert sl["check_megakernel"]["ok"], sl["check_megakernel"]
            rows = {r["row"]: r for t in sl["timings"] for r in t["rows"]}
            for t in sl["timings"]:  # a row's label names its context (it once read a literal "{context}")
                assert all(r["label"].endswith(f"ctx {t['context']}]") for r in t["rows"]), t["rows"]
            assert set(rows) == {"superop", "megakernel", "eager"}
            for r in rows.values():
                assert r["ms_per_token"] > 0 and r["launches_per_step"] > 0 and r["mbu"] > 0 and r["finite_logits"], r
            assert rows["megakernel"]["launches_per_step"] == 1 and rows["megakernel"]["schedule"]
    assert len(kimi["slices"]) == 2 and kimi["extrapolation"]["rows"]  # 2 layers and 1 layer, extrapolated to 27
    for shape in (llama, kimi):  # the bandwidth floor beside every timing
        assert all(t["floor"]["floor_ms_per_token"] > 0 for sl in shape["slices"] for t in sl["timings"])
    (check,) = report["gpucheck"]  # the offline GPU check of both shapes at their real widths, 2 layers
    kernels = {(r["shape"], r["kernel"].split(" (")[0]) for r in check["rows"]}
    assert {("llama-3.2-1b", "megakernel"), ("kimi-linear-48b-a3b", "megakernel")} <= kernels
    assert ("kimi-linear-48b-a3b", "moe_experts:moe_experts_kernel") in kernels
    assert [v for r in check["rows"] for v in r["violations"]] == []  # every kernel of both shapes passes
    out = capsys.readouterr().out
    assert "ms/token" in out and "violation(s) of the offline check" in out and "CTA/SM" in out


class _Executor:
    """The reference itself as an executor, its logits shifted by ``shift`` x their max on one entry."""

    def __init__(self, model, shift: float = 0.0):
        self.model, self.shift = model, shift

    def forward(self, ids, cache, batch, last_only=True):
        out = self.model(ids, cache, batch, last_only=last_only).float()
        out[..., 0] += self.shift * out.abs().max()
        return out


@pytest.mark.parametrize("name", ["kimi_k3_mxfp4", "llama"])
def test_the_bf16_check_measures_its_floor_against_an_fp32_copy(name):
    """With an fp32 copy of the reference, the check reports how far bf16 PyTorch is from fp32 (the floor) and how
    far the executor is. An executor as close as the reference passes on the floor; one that moves a logit by
    several floors and beyond the 5e-2 tolerance fails. Without the copy the check is the plain one."""
    bench = _bench()
    model = tiny_model(name, dtype=torch.bfloat16)
    truth = bench.fp32_truth(model)
    assert truth.embed_tokens.weight.dtype == torch.float32
    assert torch.equal(truth.embed_tokens.weight, model.embed_tokens.weight.float())  # the same values, upcast
    packed = [k for k, v in model.state_dict().items() if not v.is_floating_point()]
    assert (name == "kimi_k3_mxfp4") == bool(packed)  # MXFP4 experts and their scales: shared, not copied
    for key in packed:
        assert truth.state_dict()[key].data_ptr() == model.state_dict()[key].data_ptr()

    def check(executor, with_truth=True):
        with torch.inference_mode():
            result, _ = bench.correctness(
                model, executor, model.cfg, torch.bfloat16, "cpu", 7, 3, 11, truth if with_truth else None
            )
        return result

    same = check(_Executor(model))
    assert same["max_rel_err"] == 0 and same["fp32_floor_rel_err"] > 0  # bf16 is not fp32
    assert same["max_rel_err_vs_fp32"] == same["fp32_floor_rel_err"] and same["within_floor"] and same["ok"]
    shift = max(0.2, 4 * same["fp32_floor_rel_err"])
    moved = check(_Executor(model, shift))
    assert moved["max_rel_err"] > moved["tolerance"] and moved["max_rel_err_vs_fp32"] > 2 * moved["fp32_floor_rel_err"]
    assert not moved["within_floor"] and not moved["ok"]
    plain = check(_Executor(model), with_truth=False)
    assert "fp32_floor_rel_err" not in plain and plain["ok"]


def test_help_lists_every_option(capsys):
    """--help runs (a help string argparse cannot format fails here) and explains every option."""
    import pytest

    bench = _bench()
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["--help"])
    text = capsys.readouterr().out
    options = [a for a in bench.build_parser()._actions if a.option_strings and a.dest != "help"]
    assert e.value.code == 0 and options
    for action in options:
        assert action.help and all(flag in text for flag in action.option_strings), action.option_strings


@pytest.mark.parametrize("argv", [["--rows=eager"], ["--row", "eager"], ["--rows", "eager"]])
def test_rows_are_what_the_command_line_says_however_it_is_spelled(argv):
    """On a CPU the default rows are superop,megakernel,eager; a --rows given as --rows=eager or abbreviated
    was once replaced by that default."""
    assert _bench().parse_args(["--dry-run", *argv]).rows == ["eager"]


@pytest.mark.parametrize(
    "flag, value", [("--steps", "0"), ("--context", "-3"), ("--k3-layers", "0"), ("--budget-s", "x")]
)
def test_a_count_out_of_range_is_refused_by_name(flag, value, capsys):
    with pytest.raises(SystemExit) as e:
        _bench().parse_args(["--dry-run", flag, value])
    assert e.value.code == 2 and f"argument {flag}" in capsys.readouterr().err


def test_a_shape_lost_whole_is_in_the_table_and_counts_as_a_failure(tmp_path, monkeypatch, capsys):
    """A shape that raises (out of memory on a GPU) was left out of the table, and the run said nothing."""
    monkeypatch.delenv("OUT", raising=False)
    bench = _bench()

    def no_room(name, *args):
        raise torch.OutOfMemoryError(f"CUDA out of memory building {name}")

    monkeypatch.setattr(bench, "run_shape", no_room)
    out = tmp_path / "decode.json"
    report = bench.main(
        ["--dry-run", "--no-gpucheck", "--shapes", "llama-3.2-1b", "--rows", "eager", "--out", str(out)]
    )
    assert bench._failures(report) == 1 and report["status"].startswith("complete, 1 failure")
    captured = capsys.readouterr()
    line = next(x for x in captured.out.splitlines() if x.startswith("llama-3.2-1b"))
    assert "error: OutOfMemoryError: CUDA out of memory building llama-3.2-1b" in line
    assert "1 failure(s)" in captured.err


def test_a_check_with_no_room_beside_the_fp32_copy_is_made_without_it(monkeypatch):
    """When the fp32 copy leaves no room for the check itself (a K3 slice on an 80 GB GPU), the copy is dropped
    and the check made against the bf16 reference alone; it was an error, and the shape then failed whole in
    the prefill that followed with the copy still held."""
    bench = _bench()
    real = bench.correctness
    seen = []

    def tight(*args):
        seen.append(args[-1] is not None)
        if args[-1] is not None:
            raise torch.OutOfMemoryError("no room beside the fp32 copy")
        return real(*args)

    monkeypatch.setattr(bench, "correctness", tight)
    args = bench.parse_args(
        ["--dry-run", "--rows", "superop", "--shapes", "llama-3.2-1b", "--llama-layers", "1"]
        + ["--steps", "2", "--warmup", "0", "--check-steps", "1"]
    )
    shape = bench.run_shape("llama-3.2-1b", args, torch.device("cpu"), torch.bfloat16, bench.Budget(1e9), 1.0)
    (entry,) = shape["slices"]
    assert seen == [True, False]
    assert entry["check"]["ok"] and "fp32_floor_rel_err" not in entry["check"], entry["check"]
    assert "no room for the fp32 copy" in entry["fp32_floor"]["error"]
    assert entry["timings"][0]["rows"][0]["ms_per_token"] > 0


def test_a_run_cut_short_by_the_time_budget_is_partial_not_complete(tmp_path, monkeypatch, capsys):
    """--budget-s 0 skips every shape: the report said "complete" (and nothing on stderr) with no number in it."""
    monkeypatch.delenv("OUT", raising=False)
    out = tmp_path / "decode.json"
    argv = ["--dry-run", "--no-gpucheck", "--shapes", "llama-3.2-1b", "--rows", "eager", "--budget-s", "0"]
    report = _bench().main([*argv, "--copy-bytes", str(1 << 20), "--out", str(out)])
    assert (
        json.loads(out.read_text())["status"]
        == report["status"]
        == "partial: 1 shape(s) and 0 row(s) skipped (time budget)"
    )
    assert "raise --budget-s" in capsys.readouterr().err


def test_the_status_counts_skipped_rows_beside_failures():
    """Rows skipped inside a timed shape make the run partial too; failures are still said after it."""
    bench = _bench()
    rows = [{"row": "superop", "ms_per_token": 1.0}, {"row": "eager", "skipped": "time budget"}]
    report = {"shapes": [{"shape": "a", "slices": [{"timings": [{"rows": rows}, {"rows": rows[1:]}]}]}]}
    assert bench._status(report) == "partial: 0 shape(s) and 2 row(s) skipped (time budget)"
    report["shapes"].append({"shape": "b", "error": "OutOfMemoryError"})
    assert bench._status(report).endswith("skipped (time budget), 1 failure(s): see the shapes' checks and rows")
    assert bench._status({"shapes": [{"shape": "a", "slices": [{"timings": [{"rows": rows[:1]}]}]}]}) == "complete"
