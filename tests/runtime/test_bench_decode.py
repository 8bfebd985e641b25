"""``bench/decode.py`` runs end to end on a CPU (--dry-run: narrow twins, the twins as superop, the
megakernel under Triton's interpreter) and writes a report with every row timed, the correctness
checks passed and the launches counted."""

from __future__ import annotations

import json

from nonstop.cache.pages import PAGE_SIZE
from nonstop.hostinfo import environment
from tests.bench_script import load_bench


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
