"""The bench scripts as a user meets them on a machine without the GPU they ask for, and how a run with
failures reports itself."""

from __future__ import annotations

import json

import pytest
import torch

from nonstop.hostinfo import cuda_missing
from tests.bench_script import load_bench


def test_cuda_missing_says_why_and_what_to_run_instead(monkeypatch):
    assert cuda_missing("cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA device here" in cuda_missing("cuda") and "use --device cpu" in cuda_missing("cuda")
    assert cuda_missing("cuda", cpu_hint="--dry-run").endswith("use --dry-run")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert cuda_missing("cuda:0", ranks=2) is None
    assert cuda_missing("cuda", ranks=4) == "4 ranks need 4 GPUs, this machine has 2"


@pytest.mark.parametrize(
    ("script", "argv"),
    [
        ("op_check.py", ["--shapes", "llama-3.2-1b"]),
        ("decode.py", ["--shapes", "llama-3.2-1b"]),
    ],
)
def test_a_gpu_run_without_a_gpu_is_one_line(script, argv, monkeypatch, capsys):
    """op_check ended in an AssertionError from torch's CUDA init; every script now stops in its parser."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    bench = load_bench(script)
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no CUDA device here" in err and "Traceback" not in err


def test_a_decode_report_with_failures_does_not_call_itself_clean():
    bench = load_bench("decode.py")
    ok_row = {"row": "superop", "ms_per_token": 1.0}
    clean = {"shapes": [{"slices": [{"check": {"ok": True}, "timings": [{"rows": [ok_row]}]}]}]}
    assert bench._failures(clean) == 0
    broken = {
        "shapes": [
            {"shape": "a", "error": "OutOfMemoryError"},
            {
                "slices": [
                    {
                        "check": {"ok": False},
                        "check_megakernel": {"error": "InterpreterError"},
                        "fp32_floor": {"error": "no room for the fp32 copy"},  # a skip, not a failure
                        "timings": [{"rows": [ok_row, {"row": "megakernel", "error": "InterpreterError"}]}],
                    }
                ]
            },
        ]
    }
    assert bench._failures(broken) == 4


def test_readme_numbers_has_help_and_writes_where_told(tmp_path, capsys, monkeypatch):
    """--help ran the whole script and rewrote bench/results/readme_numbers.json."""
    bench = load_bench("readme_numbers.py")
    with pytest.raises(SystemExit) as e:
        bench.main(["--help"])
    assert e.value.code == 0 and "--out" in capsys.readouterr().out
    monkeypatch.setattr(bench, "compute", lambda: {"op_counts": {}, "floors": {}, "peers": []})
    monkeypatch.setattr(bench, "fragments", lambda numbers: ["fragment"])
    out = tmp_path / "n.json"
    bench.main(["--out", str(out)])
    assert json.loads(out.read_text()) == {"op_counts": {}, "floors": {}, "peers": []}
