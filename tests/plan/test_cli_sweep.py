"""``nonstop plan`` edge cases from a tester's sweep: one clear line for bad input, honest tables and headers."""

from __future__ import annotations

import json

import pytest

from nonstop.cli import build_parser, main
from nonstop.plan.chips import chip_from_entry, get_chip, load_catalogue
from nonstop.plan.layout import Layout
from nonstop.plan.report import describe, layout_table
from nonstop.plan.search import Candidate


def _one_line_error(argv, capsys) -> str:
    """Run ``nonstop plan argv``, expect exit status 2 and one line on stderr, and return that line."""
    with pytest.raises(SystemExit) as e:
        main(["plan", *argv])
    assert e.value.code == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nonstop: error: "), out.err
    return lines[0]


def _entry(key: str = "h200", **changes) -> dict:
    entry = json.loads(json.dumps(load_catalogue()[key]))
    entry.update(changes)
    return entry


def test_list_chips_validates_every_entry_before_printing(tmp_path, capsys):
    """A chip file's bad entry is the normal one-line error under --list-chips too, and nothing is printed
    before it (a negative figure used to fail after 16 rows)."""
    path = tmp_path / "chips.json"
    path.write_text(json.dumps({"x1": [1]}))
    err = _one_line_error(["--list-chips", "--chip-file", str(path)], capsys)
    assert "chip 'x1': an entry must be a JSON object" in err
    path.write_text(json.dumps({"x1": _entry(hbm_gbps=-1)}))
    with pytest.raises(SystemExit) as e:
        main(["plan", "--list-chips", "--chip-file", str(path)])
    out = capsys.readouterr()
    assert e.value.code == 2 and out.out == "" and "hbm_gbps must be a positive finite number" in out.err


def test_list_chips_shows_the_fp32_rate_and_a_chip_files_entry(tmp_path, capsys):
    path = tmp_path / "chips.json"
    path.write_text(json.dumps({"x1": _entry(name="my accelerator")}))
    assert main(["plan", "--list-chips", "--chip-file", str(path)]) == 0
    out = capsys.readouterr().out
    assert "fp32" in out.splitlines()[0] and "my accelerator" in out and "this machine" in out


def test_dropped_layouts_show_bytes_per_chip_on_two_device_chips():
    """A layout the search dropped on its quick bound shows that bound per chip, like a predicted one: on
    TPU7x (two ranks a chip) twice a rank's bytes."""
    tpu = get_chip("tpu-v7")
    table = layout_table([Candidate(Layout(8), 201.1e9)], 5, tpu)
    row = table.splitlines()[1]
    assert "402.2" in row and "needs >= 201.1 GB per rank" in row


def test_dense_models_name_no_expert_placement(capsys):
    assert Layout(4).describe(routed_experts=False) == "TP4"
    assert Layout(1, 4).describe(routed_experts=False) == "TP1 DP4"
    assert Layout(16, dcp=2).describe(routed_experts=False) == "TP16 DCP2"
    assert Layout(4).describe() == "TP4 experts TP"  # a MoE model's still does
    assert main(["plan", "-m", "llama-3.2-1b", "--chip", "h100", "--chips", "4"]) == 0
    out = capsys.readouterr().out
    assert "experts TP" not in out and "TP1 DP4 " in out


def test_the_layout_column_fits_the_longest_name():
    name = Layout(1, 64, 1, pp=8).describe()
    assert name == "TP1 DP64 experts TP64 PP8" and len(name) > 22
    table = layout_table([Candidate(Layout(1, 64, 1, pp=8), 1e12), Candidate(Layout(8), 1e12)], 5, get_chip("a100"))
    header, *rows = table.splitlines()
    starts = {line.index(" 512 ") if " 512 " in line else line.index("   8 ") for line in rows}
    assert len(starts) == 1 and header.index("ranks") < min(starts) + 5  # the ranks column lines up


def test_fp32_weights_plan_on_the_nvidia_gpus(capsys):
    """fp32 weights are priced at the plain FP32 rate (not TF32: PyTorch's float32 matmuls keep TF32 off by
    default), which every NVIDIA entry sources."""
    entries = load_catalogue()
    for key in ("a100", "h100", "h800", "h20", "h200", "b200", "b300", "gb200", "gb300"):
        chip = chip_from_entry(key, entries[key])
        assert 0 < chip.tflops["fp32"] < chip.tflops["bf16"] / 3 and chip.sources["tflops.fp32"]
    argv = ["plan", "-m", "llama-3.2-1b", "--chip", "h100", "--chips", "1", "--weights", "fp32", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] and out["precision"]["dense"] == "fp32"


def test_format_flags_list_exactly_the_accepted_formats():
    from nonstop.plan.workload import FORMAT_BYTES

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["plan"]
    helps = {a.dest: a.help for a in sub._actions}
    for dest in ("weights", "experts", "attention", "cache"):
        assert ", ".join(FORMAT_BYTES) in helps[dest], dest


def test_no_chip_count_fits_says_every_count_was_tried(capsys):
    argv = ["plan", "-m", "kimi-k3", "--chip", "a100", "--batch", "100000"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "fits no layout of 1, 2, 4, ... 512 x a100 (each tried)" in out and "on 512 x a100" in out
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["chips_tried"] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--chips", "5", "--tp", "3", "--batch", "64", "--context", "999"], "--chips, --tp, --batch, --context"),
        (["--dcp", "7", "--sharding", "engine"], "--dcp, --sharding"),
        (["-m", "k3-nano", "--spec-accept", "2"], "-m, --spec-accept"),
    ],
)
def test_measured_refuses_the_flags_it_ignores(flags, named, capsys):
    err = _one_line_error(["--chip", "h200", "--measured", *flags], capsys)
    assert f"ignores {named}:" in err


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--kv-cache", "--kv-cache 'fp2': unknown attention cache format"),
        ("--attention-weights", "--attention-weights 'fp2': unknown attention weight format"),
        ("--weights", "--weights 'fp2': unknown dense weight format"),
    ],
)
def test_a_bad_format_names_its_flag(flag, message, capsys):
    err = _one_line_error(["-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--tp", "8", flag, "fp2"], capsys)
    assert message in err and "choose one of: fp32, bf16" in err


def test_a_chip_file_that_is_a_directory_is_named(tmp_path, capsys):
    err = _one_line_error(["--chip", "h200", "--chips", "8", "--chip-file", str(tmp_path)], capsys)
    assert f"chip file {tmp_path}: " in err and "Errno" not in err


def test_deepseek_v32_is_refused_for_its_sparse_attention(capsys):
    for name in ("deepseek-ai/DeepSeek-V3.2", "DeepSeek-V3.2-Exp"):
        err = _one_line_error(["-m", name, "--chip", "b300", "--chips", "8"], capsys)
        assert "sparse attention" in err and "not modelled" in err and "planner models and releases" not in err


def test_pp_or_dcp_alone_plans_one_layout_as_the_help_says(capsys):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["plan"]
    assert "--pp, --dcp" in sub.description and "every layout is tried" in sub.description
    assert main(["plan", "-m", "llama-3.2-1b", "--chip", "h100", "--chips", "4", "--pp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "layouts" not in out and (out["layout"]["tp"], out["layout"]["pp"]) == (2, 2)


def test_help_says_what_the_tester_missed():
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["plan"]
    helps = {a.dest: a.help for a in sub._actions}
    assert "[1, K+1]" in helps["spec_accept"] and "no default" in helps["spec_accept"]
    assert "64" in helps["spec_draft"]
    assert "tpu7x" in helps["chip"] and "h100-80gb" in helps["chip"]
    assert "sources" in helps["chip_file"]


def test_spec_draft_is_capped(capsys):
    argv = ["-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--tp", "8", "--spec-accept", "2"]
    err = _one_line_error([*argv, "--spec-draft", "100000"], capsys)
    assert "--spec-draft 100000" in err and "up to 64" in err


def test_a_cpu_that_does_not_fit_says_ram(capsys):
    """A CPU's memory is RAM: the no-fit line and the memory line say so (an accelerator's stay HBM)."""
    from nonstop.config import ModelConfig
    from nonstop.plan.predict import predict
    from nonstop.plan.workload import Precision, build_workload

    cfg = ModelConfig.preset("llama-3.2-1b")
    workload = build_workload(cfg, "llama-3.2-1b", Precision.released(cfg))
    entry = _entry(kind="cpu", hbm_gb=1, name="a small CPU")
    del entry["hbm_visible_gb"]
    p = predict(workload, chip_from_entry("tiny", entry), Layout(), 1, 4096)
    assert not p.fits and p.why_not().endswith("of 1.0 GB RAM)") and "HBM" not in describe(p).split("step time")[0]
    gpu = predict(workload, get_chip("h100"), Layout(), 1, 4096)
    assert "GB HBM" in describe(gpu)


def test_multi_chip_cpu_plans_are_refused(tmp_path, capsys):
    """The catalogue's cpu entry plans one chip (max_chips 1, sourced): more is one line, whatever the layout."""
    entry = load_catalogue()["cpu"]
    assert entry["max_chips"] == 1 and entry["sources"]["max_chips"]
    for flags in (["-m", "llama-3.2-1b", "--chips", "2", "--tp", "2"], ["-m", "kimi-k3", "--chips", "4"]):
        err = _one_line_error(["--chip", "cpu", *flags], capsys)
        assert "cpu plans at most 1 chip(s)" in err
    path = tmp_path / "chips.json"  # the rule is the data's: any entry's max_chips
    path.write_text(json.dumps({"x1": _entry(max_chips=4, sources={**_entry()["sources"], "max_chips": "test"})}))
    err = _one_line_error(["--chip", "x1", "--chips", "8", "--chip-file", str(path)], capsys)
    assert "--chips 8: x1 plans at most 4 chip(s) - test" in err


def test_a_cpus_bandwidth_bound_is_named_ram():
    """The bound line names the chip's memory: "RAM bandwidth" on a CPU, "HBM bandwidth" on an accelerator."""
    from nonstop.config import ModelConfig
    from nonstop.plan.predict import predict
    from nonstop.plan.workload import Precision, build_workload

    cfg = ModelConfig.preset("llama-3.2-1b")
    workload = build_workload(cfg, "llama-3.2-1b", Precision.released(cfg))
    slow = {"hbm_gbps": 50}  # 50 GB/s: bandwidth, not launches, bounds a 1B model's step
    cpu = predict(workload, chip_from_entry("c", _entry(kind="cpu", name="a CPU", **slow)), Layout(), 1, 4096)
    gpu = predict(workload, chip_from_entry("g", _entry(name="a slow GPU", **slow)), Layout(), 1, 4096)
    assert cpu.time.bound() == "RAM bandwidth (weights)", cpu.time.bound()
    assert gpu.time.bound() == "HBM bandwidth (weights)", gpu.time.bound()
    assert "bound                RAM bandwidth" in describe(cpu)


def test_the_fewest_chips_search_stops_at_the_ranks_the_planner_models(tmp_path, capsys, monkeypatch):
    """A 64-rank chip: the fewest-chips search tries 1, 2, ... chips while they hold at most 2^20 ranks (it
    walked up to 512 chips: with devices_per_chip 10^12 it never ended)."""
    from nonstop.commands import plan as plan_command

    asked = []
    monkeypatch.setattr(plan_command, "FEWEST_CHIPS", (1, 2, 4, 1 << 14, 1 << 15))
    import nonstop.plan.search as search_module

    def fake_search(workload, chip, n, **_):
        asked.append(n)
        return []

    monkeypatch.setattr(search_module, "search", fake_search)
    chip = chip_from_entry("wide", _entry(devices_per_chip=64))
    _, _, tried = plan_command._fewest_chips(None, chip, {}, "production", None)
    assert tried == asked == [1, 2, 4, 1 << 14]  # 2^14 x 64 = 2^20 ranks; 2^15 x 64 is past it


def test_dp_attention_with_a_tp_that_is_not_the_stage_names_the_tp_typed(capsys):
    err = _one_line_error(
        ["-m", "kimi-k2", "--chip", "h200", "--chips", "16", "--tp", "8", "--dp", "8", "--enable-dp-attention"],
        capsys,
    )
    assert "SGLang's --tp counts every rank of a stage, so --tp 16 here" in err and "--tp 8 is not" in err
