"""Gaps a second mutation audit of ``nonstop plan`` found: the full report (``report.describe``), the measured
side-by-side, the command line's refusals and JSON, a chip file's top level and max_chips, and the k3-nano
drafter's cache. Expected values are hand arithmetic, the help text and docstrings, never the code's output."""

from __future__ import annotations

import json
import re

import pytest

from nonstop.cli import main
from nonstop.config import ModelConfig
from nonstop.plan.chips import get_chip, load_catalogue
from nonstop.plan.layout import Layout
from nonstop.plan.measured import Measurement
from nonstop.plan.predict import Spec, predict
from nonstop.plan.report import describe, measured_table, workload_for_measurement
from nonstop.plan.workload import build_workload
from nonstop.program.preflight import size_text

from .made_up_chip import made_up_chip

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def nano():
    return build_workload(ModelConfig.preset("k3-nano"), "k3-nano")


def _refused(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(["plan", *argv])
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nonstop: error: "), lines
    return lines[0]


def _chip_file(tmp_path, key="x1", **changes):
    entry = json.loads(json.dumps(load_catalogue()["h200"]))
    del entry["hbm_visible_gb"]
    entry.update(changes)
    if "max_chips" in changes:
        entry["sources"]["max_chips"] = "test figure"
    path = tmp_path / "chips.json"
    path.write_text(json.dumps({key: entry}))
    return path


# ---- chip files and the command line


def test_a_chip_file_whose_top_level_is_a_list_is_one_line(tmp_path, capsys):
    """chips.py: the top level must be an object of chip entries; a list was an internal-error traceback
    ('list' object has no attribute 'items') without the check."""
    path = tmp_path / "chips.json"
    path.write_text("[1, 2]")
    err = _refused(capsys, "--list-chips", "--chip-file", str(path))
    assert "top level must be an object" in err


def test_the_fewest_chips_search_tries_a_count_equal_to_max_chips(tmp_path, capsys):
    """A chip that plans at most 2 chips still tries 2 (``n > max_chips`` stops, not ``>=``)."""
    path = _chip_file(tmp_path, hbm_gb=0.001, max_chips=2)  # 1 MB: k3-nano fits no count
    assert main(["plan", "-m", "k3-nano", "--chip", "x1", "--chip-file", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["chips_tried"] == [1, 2]


def test_a_json_plan_that_does_not_fit_says_why(tmp_path, capsys):
    """--json of a layout that does not fit carries why_not (the text report's reason)."""
    path = _chip_file(tmp_path, hbm_gb=0.001)
    argv = ["plan", "-m", "k3-nano", "--chip", "x1", "--chip-file", str(path), "--chips", "1", "--tp", "1", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is False and "GB per rank" in out["why_not"]


def test_a_search_that_grows_says_the_fewer_counts_did_not_fit(tmp_path, capsys):
    """Without --chips, when 1 chip does not fit and 2 do, the header says 1 was tried and did not fit."""
    path = _chip_file(tmp_path, hbm_gb=0.016)  # 16 MB: k3-nano needs ~19 MB on one rank, less on two
    assert main(["plan", "-m", "k3-nano", "--chip", "x1", "--chip-file", str(path)]) == 0
    out = capsys.readouterr().out
    assert "k3-nano fits no layout of 1 x x1; the fewest that fit:" in out
    assert "k3-nano on 2 x x1:" in out


def test_the_cpu_chip_plans_a_layout_without_chips(capsys):
    """--chips defaults to 1 on the cpu chip (its only count), so a layout flag needs no --chips there."""
    assert main(["plan", "-m", "k3-nano", "--chip", "cpu", "--tp", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["chips"] == 1 and "chips_tried" not in out


def test_dp_attention_with_a_dp_that_does_not_divide_tp_is_named(capsys):
    """SGLang --enable-dp-attention: --dp must divide --tp; --tp 4 --dp 8 is refused for that reason."""
    argv = ["-m", "k3-nano", "--chip", "h100", "--chips", "8", "--tp", "4", "--dp", "8", "--enable-dp-attention"]
    assert "needs --dp dividing --tp" in _refused(capsys, *argv)


@pytest.mark.parametrize(
    "flags,named",
    [
        (["--chip", "cpu", "--measured", "--context", "0"], "--context"),
        (["--chip", "cpu", "--measured", "--spec-accept", "0", "--json"], "--spec-accept"),
        (["--list-chips", "--context", "0"], "--context"),
    ],
)
def test_ignored_flags_given_as_zero_are_refused_too(flags, named, capsys):
    """--measured and --list-chips ignore --context and --spec-accept: a given 0 is refused like any other
    value (``_refuse_ignored`` tested ``not in (None, False)``, and 0 == False passed as not given)."""
    err = _refused(capsys, *flags)
    assert named in err


def test_list_chips_columns_line_up_with_a_long_key(tmp_path, capsys):
    """--list-chips: the chip column is as wide as the longest key, so every name starts under 'name'."""
    key = "a-very-long-chip-key-x"
    path = _chip_file(tmp_path, key=key)
    assert main(["plan", "--list-chips", "--chip-file", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    col = lines[0].index("name")
    row = next(line for line in lines if line.startswith(key))
    assert row[col - 1] == " " and row[col:].startswith("NVIDIA H200")


# ---- the full report


def test_a_report_that_does_not_fit_says_so_and_why(nano):
    """describe(): the memory line ends 'DOES NOT FIT' and the next names what a rank needs."""
    chip = made_up_chip(hbm_gb=0.001)
    p = predict(nano, chip, Layout(), 1, 64)
    text = describe(p)
    assert not p.fits and "-> DOES NOT FIT" in text
    assert p.why_not() in text and "GB per rank" in p.why_not()


def test_the_report_sizes_memory_per_chip_on_two_device_chips(nano):
    """A chip of two ranks holds twice a rank's bytes and offers twice a rank's capacity."""
    chip = made_up_chip(devices_per_chip=2)
    p = predict(nano, chip, Layout(tp=2), 1, 64)
    line = next(x for x in describe(p).splitlines() if x.startswith("memory per chip"))
    assert line.startswith(
        f"memory per chip: {size_text(2 * p.bytes_per_rank)} of {size_text(2 * p.capacity_per_rank)}"
    )
    assert f"of {size_text(100e9)} HBM" in line


def test_the_report_names_the_sold_capacity_beside_the_drivers(nano):
    """H200: 141 GB sold, more reported by the driver; the report says both."""
    p = predict(nano, get_chip("h200"), Layout(), 1, 64)
    assert "the driver reports; sold as 141 GB" in describe(p)


def test_an_uneven_batch_names_the_fullest_group(nano):
    """6 sequences over 4 attention groups: the fullest holds ceil(6 / 4) = 2."""
    p = predict(nano, made_up_chip(), Layout(tp=1, dp=4), 6, 64)
    assert "(6 sequences over 4 attention groups: the fullest holds 2" in describe(p)


def test_a_dense_models_header_names_no_expert_format():
    """A dense model has no routed experts: the header's experts entry is '-'."""
    llama = build_workload(ModelConfig.preset("llama-3.2-1b"), "llama-3.2-1b")
    assert " experts -," in describe(predict(llama, made_up_chip(), Layout(), 1, 64))


def test_step_shares_add_to_the_step_with_speculation(nano):
    """The step-time rows are shares of the step (they add to 100%), not of ms per token (a step of
    accepted length 3 would show 300%); weight streaming and collectives are always shown."""
    p = predict(nano, made_up_chip(), Layout(), 1, 64, Spec(3.0, 3))
    text = describe(p).split("step time (busiest rank):")[1]
    shares = [float(s) for s in re.findall(r"ms\s+([\d.]+)%", text)]
    assert sum(shares) == pytest.approx(100.0, abs=0.5)
    assert re.search(r"collectives\s+0\.000 ms", text)  # one rank: none, still a row


def test_collectives_across_domains_are_scale_out_and_sorted(nano):
    """A two-rank group on chips whose scale-up domain is one chip crosses scale-out; rows slowest first."""
    p = predict(nano, made_up_chip(up_domain=1), Layout(tp=2), 1, 64)
    rows = describe(p).split("calls):")[1].strip().splitlines()
    assert rows and all("scale-out" in r for r in rows)
    both = [sum(map(float, re.search(r"latency\s+([\d.]+) ms\s+bandwidth\s+([\d.]+)", r).groups())) for r in rows]
    assert both == sorted(both, reverse=True)


# ---- the measured side-by-side


def _m(**changes) -> Measurement:
    figures = dict(source="x.json", what="run", batch=1, dtype="float32", ms_per_token=2.0, tokens_per_s_total=500)
    return Measurement(**{**figures, **changes})


def test_the_measured_table_ratio_is_predicted_over_measured():
    """pred/meas of 3 ms predicted for 2 ms measured is 1.50; a GPU run (no CPU) adds no 'another CPU' note."""
    table = measured_table([{"measurement": _m(), "predicted_ms_per_token": 3.0}])
    row = table.splitlines()[1].split()
    assert row[1:4] == ["2.00", "3.00", "1.50"]
    assert "another CPU" not in table


def test_a_float16_run_is_priced_at_two_bytes():
    """A measurement in float16 is priced as a 2-byte format (bf16), not fp32."""
    w = workload_for_measurement({})(_m(dtype="float16", model="k3-nano"))
    assert w.precision.dense == "bf16"


# ---- the bundled drafter


def test_the_bundled_k3_nano_drafter_keeps_a_key_and_value_per_head():
    """k3-nano's dspark/config.json: 1 layer, 4 heads of 64; nonstop's DSpark layers keep a key / value per
    head, so a context position caches 1 x 2 x 4 x 64 x 2 B = 1024 B and no k / v weight is trimmed."""
    import torch

    from nonstop.engine.speculative.dspark import DSparkConfig, DSparkModel
    from nonstop.plan.draft import draft_shape
    from nonstop.weights.resolve import resolve_model

    cfg, model_dir = resolve_model("k3-nano")
    shape = draft_shape(cfg, model_dir, 7)
    assert shape.context_bytes_per_token == 1 * 2 * 4 * 64 * 2 and shape.window == 64
    with torch.device("meta"):
        model = DSparkModel(DSparkConfig.load(model_dir / "dspark" / "config.json"))
    assert shape.params == sum(p.numel() for p in model.parameters())


def test_a_zero_tensor_peak_in_a_chip_file_is_refused():
    """tflops.fp8 0 is no figure (null says "not native"); only null is skipped."""
    from nonstop.plan.chips import ChipError, chip_from_entry

    entry = json.loads(json.dumps(load_catalogue()["h200"]))
    entry["tflops"]["fp8"] = 0
    with pytest.raises(ChipError, match="tflops.fp8 must be a positive finite number or null"):
        chip_from_entry("h200", entry)


def test_the_cpu_chip_is_measured_beside_a_chip_file_without_a_cpu_entry(tmp_path):
    """--chip cpu with a --chip-file that adds another chip still plans this machine (measured figures), not
    the catalogue's cpu entry validated as if the file gave it."""
    chip = get_chip("cpu", _chip_file(tmp_path))
    assert chip.kind == "cpu" and chip.hbm_gbps > 0
