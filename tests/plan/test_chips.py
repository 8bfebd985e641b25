"""The chip catalogue: every chip the issue names, every figure with a source, --chip-file entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nonstop.plan.chips import ChipError, chip_from_entry, chip_names, get_chip, load_catalogue

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
NAMED = ("h100", "h200", "b200", "b300", "gb200", "gb300", "mi300x", "mi325x", "mi355x", "tpu-v7")


def test_catalogue_has_every_named_chip_with_sources():
    entries = load_catalogue()
    for key in NAMED:
        chip = chip_from_entry(key, entries[key])  # validates every required figure and its source
        for path in (
            "hbm_gb",
            "hbm_gbps",
            "tflops.bf16",
            "tflops.fp8",
            "tflops.fp4",
            "scale_up.domain",
            "scale_up.gbps",
            "scale_up.latency_us",
            "scale_out.gbps",
            "scale_out.latency_us",
        ):
            assert chip.sources.get(path), f"{key}: no source for {path}"
        assert chip.rank_flops("fp8") >= chip.rank_flops("bf16") > 0


def test_dtype_fallback_and_devices_per_chip():
    h200, tpu, b300 = get_chip("h200"), get_chip("TPU-V7"), get_chip("b300")
    assert h200.rank_flops("fp4") == h200.rank_flops("fp8")  # Hopper: no FP4, runs at the FP8 rate
    assert b300.rank_flops("fp4") > b300.rank_flops("fp8")
    assert tpu.devices_per_chip == 2
    assert tpu.rank_hbm_bytes == pytest.approx(192 * 2**30 / 2, rel=1e-3)  # 192 GiB a chip, half to each TensorCore


def test_chips_without_fp8_or_fp4_run_them_at_the_bf16_rate_and_every_figure_is_sourced():
    """A100 (Ampere) and Ascend 910C have no FP8 / FP4 tensor path: those weights run at the BF16 rate. The
    910C's two dies are its ranks, each with half the package's HBM and bandwidth."""
    entries = load_catalogue()
    for key in ("a100", "ascend-910c"):
        chip = chip_from_entry(key, entries[key])
        assert chip.rank_flops("fp4") == chip.rank_flops("fp8") == chip.rank_flops("bf16") > 0
        assert all(chip.sources.get(path) for path in ("tflops.fp8", "tflops.fp4", "scale_up.gbps", "hbm_gbps"))
    ascend = get_chip("ascend-910c")
    assert ascend.devices_per_chip == 2 and ascend.rank_hbm_bytes == pytest.approx(64e9)
    assert ascend.up_domain_ranks == 2 * 384


def test_capacity_is_what_the_driver_reports_not_the_sold_figure_read_as_1e9_bytes():
    """Vendors sell HBM in binary units: an H200 "141 GB" is 143771 MiB to nvidia-smi, and nonstop's own H200
    session read 139.8 GiB through torch (bench/results). The planner fits into the driver's figure; read as
    1e9 B the sold figure would leave an H200 6% short (141e9 against the ~150e9 its measurement saw)."""
    measured = {
        json.loads(path.read_text())["environment"]["gpu_memory_GiB"]
        for path in RESULTS.glob("decode_nvidia-h200-*.json")
    }
    assert measured, "no H200 measurement in bench/results"
    h200 = get_chip("h200")
    for gib in measured:  # torch's total_memory is the driver's total less a little it keeps back
        assert 0.99 < gib * 2**30 / h200.rank_hbm_bytes <= 1.0
    assert h200.hbm_gb == 141 and h200.rank_hbm_bytes > 1.06 * 141e9
    entries = load_catalogue()
    for key in NAMED:
        chip = chip_from_entry(key, entries[key])
        assert chip.sources.get("hbm_visible_gb"), f"{key}: no driver capacity"
        assert chip.hbm_gb * 1e9 <= chip.hbm_bytes <= chip.hbm_gb * 2**30 * 1.001, key  # sold as GB ... GiB


def test_a_driver_capacity_far_from_the_sold_one_is_refused():
    """A --chip-file entry copied from another part that changes hbm_gb but keeps that part's driver figure
    would silently fit into the wrong capacity; it is refused, naming both figures."""
    entry = json.loads(json.dumps(load_catalogue()["h200"]))
    entry["hbm_gb"] = 500
    with pytest.raises(ChipError, match="hbm_visible_gb 150.8 is far from hbm_gb 500"):
        chip_from_entry("x1", entry)
    del entry["hbm_visible_gb"]
    assert chip_from_entry("x1", entry).rank_hbm_bytes == 500e9  # without one, the sold figure as 1e9 B
    entry.update(hbm_visible_gb=520, sources={k: v for k, v in entry["sources"].items() if k != "hbm_visible_gb"})
    with pytest.raises(ChipError, match="hbm_visible_gb has no source"):
        chip_from_entry("x1", entry)


def test_chip_file_adds_and_overrides(tmp_path):
    entry = json.loads(json.dumps(load_catalogue()["h200"]))
    entry.update(name="my accelerator", hbm_gb=500)
    del entry["hbm_visible_gb"]
    path = tmp_path / "chips.json"
    path.write_text(json.dumps({"X1": entry, "h100": {**entry, "hbm_gb": 96}}))
    assert get_chip("x1", path).hbm_gb == 500
    assert get_chip("h100", path).hbm_gb == 96
    assert "x1" in chip_names(path)


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"hbm_gb": -1}, "hbm_gb must be a positive finite number"),
        ({"sources": {}}, "has no source"),
        ({"sources": {"launch_us": "x"}}, "figure hbm_gb has no source"),  # every figure, not only the last
        ({"tflops": {"bf16": 989, "fp8": "fast"}}, "tflops.fp8 must be a positive finite number or null"),
        ({"scale_up": {"domain": 8, "gbps": 450}}, "scale_up.latency_us must be a positive finite number"),
        ({"hbm_gbps": float("nan")}, "hbm_gbps must be a positive finite number"),  # JSON's NaN
        ({"hbm_gbps": float("inf")}, "hbm_gbps must be a positive finite number"),
        ({"hbm_gb": 1e308}, "hbm_gb must be a positive finite number"),  # finite, but x 1e9 B is infinite
        ({"tflops": {"bf16": 1e300}}, "tflops.bf16 must be a positive finite number"),
        ({"tflops": {"bf16": float("nan")}}, "tflops.bf16 must be a positive finite number"),
        ({"devices_per_chip": 0}, "devices_per_chip must be a whole number from 1 to 64"),
        ({"devices_per_chip": 1.5}, "devices_per_chip must be a whole number from 1 to 64"),
        ({"devices_per_chip": 10**12}, "devices_per_chip must be a whole number from 1 to 64"),  # hung the search
        ({"tflops": {"bf16": 989, "fp16": 5}}, "tflops.fp16 is no figure"),  # was read as nothing, silently
        ({"scale_up": {"domain": 7.5, "gbps": 450, "latency_us": 1.0}}, "scale_up.domain must be a whole number"),
    ],
)
def test_bad_chip_entries_name_the_figure(entry, message):
    base = json.loads(json.dumps(load_catalogue()["h200"]))
    base.update(entry)
    with pytest.raises(ChipError, match=message):
        chip_from_entry("bad", base)


def test_a_chip_file_entry_spelling_a_catalogue_chip_otherwise_is_refused(tmp_path):
    """One chip under two names would plan whichever name was typed: a file entry overrides a catalogue chip
    under the catalogue's key only. A size that names another part (H100 NVL, 94 GB) is another chip."""
    entry = load_catalogue()["h200"]
    path = tmp_path / "chips.json"
    for key in ("H200 SXM", "nvidia-h200", "h200-141gb"):
        path.write_text(json.dumps({key: entry}))
        with pytest.raises(ChipError, match="names the catalogue's 'h200'.*key it 'h200'"):
            get_chip("h200", path)
    path.write_text(json.dumps({"h100-94gb": {**load_catalogue()["h100"], "hbm_gb": 94, "hbm_visible_gb": 100}}))
    assert get_chip("h100-94gb", path).hbm_gb == 94 and get_chip("h100", path).hbm_gb == 80


def test_unknown_chip_lists_the_known_ones(tmp_path):
    with pytest.raises(ChipError, match="known chips: .*h200"):
        get_chip("h900")
    (tmp_path / "c.json").write_text("{not json")
    with pytest.raises(ChipError, match="not valid JSON"):
        get_chip("h200", tmp_path / "c.json")


@pytest.mark.parametrize(
    "name, key",
    [
        ("H200", "h200"),
        ("NVIDIA H100 SXM5", "h100"),
        ("gb300-nvl72", "gb300"),
        ("AMD Instinct MI355X", "mi355x"),
        ("mi300x-oam", "mi300x"),
        ("TPU v7", "tpu-v7"),
        ("tpu7x", "tpu-v7"),
        ("Ironwood", "tpu-v7"),
        ("h100-80gb", "h100"),
        ("NVIDIA B200 180GB", "b200"),
        ("B200-SXM-192GB", "b200"),  # the physical size vendors also print: within 10% of the entry's
        ("H200_141GB", "h200"),
        ("MI355X 288 GB", "mi355x"),
        ("NVIDIA A100 SXM4 80GB", "a100"),
        ("Huawei Ascend 910C", "ascend-910c"),
        ("910C", "ascend-910c"),
        ("Atlas A3", "ascend-910c"),
        ("NVIDIA H100 80GB HBM3", "h100"),  # as nvidia-smi and torch.cuda.get_device_name() print them
        ("NVIDIA B300 SXM6 AC", "b300"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA GB200", "gb200"),
    ],
)
def test_chip_names_as_vendors_and_clouds_write_them(name, key):
    assert get_chip(name).key == key


def test_an_unknown_chip_still_says_which_exist():
    with pytest.raises(ChipError, match="known chips: .*h200"):
        get_chip("h2000")


def test_a_capacity_that_names_another_part_is_refused():
    """H100 NVL (94 GB, another memory system) and a 40 GB part are not the catalogue's 80 GB H100."""
    for name in ("h100-94gb", "H100 40GB", "A100 40GB"):
        with pytest.raises(ChipError, match="has 80 GB of HBM"):
            get_chip(name)
    with pytest.raises(ChipError, match="unknown chip"):
        get_chip("cpu-16gb")  # the cpu's memory is measured, never named


def test_fp32_weights_on_a_gpu_say_how_to_plan_them(tmp_path, capsys):
    """A chip without a sourced fp32 figure (the AMD entries) refuses fp32 weights with the way out (narrower
    weights, or the chip's fp32 figure in a --chip-file, which is then used)."""
    from nonstop.cli import main

    argv = ["plan", "-m", "llama-3.2-1b", "--chip", "mi300x", "--chips", "1", "--weights", "fp32", "--json"]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "no tensor peak for fp32" in err and "--weights bf16" in err and "tflops.fp32" in err
    assert "Traceback" not in err
    entry = json.loads(json.dumps(load_catalogue()["mi300x"]))
    entry["tflops"]["fp32"] = 163
    entry["sources"]["tflops.fp32"] = "test figure"
    path = tmp_path / "chips.json"
    path.write_text(json.dumps({"mi300x": entry}))
    assert main([*argv, "--chip-file", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] and out["ms_per_token"] > 0


@pytest.mark.parametrize("source", [None, "", "   ", 3])
def test_a_source_must_say_where_the_figure_is_published(source):
    """The key alone was enough: every source null or empty loaded and listed."""
    entry = json.loads(json.dumps(load_catalogue()["h200"]))
    entry["sources"] = {path: source for path in entry["sources"]}
    with pytest.raises(ChipError, match="has no source"):
        chip_from_entry("x", entry)
