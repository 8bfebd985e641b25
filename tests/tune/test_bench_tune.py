"""``bench/tune.py --dry-run`` runs the agent end to end on a CPU (a narrow twin, one kind) and reports
the verified candidates as untimed - no speed is invented."""

from __future__ import annotations

import json

from nonstop.hostinfo import environment
from tests.bench_script import load_bench


def test_dry_run_reports_verified_and_untimed(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OUT", raising=False)
    bench = load_bench("tune.py")
    out = tmp_path / "tune.json"
    report = bench.main(
        ["--dry-run", "--models", "kimi-linear-48b-a3b", "--kinds", "linear_residual", "--out", str(out)]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(report, default=str))
    assert report["timed"] is False and "pending" in report["status"]
    assert report["environment"].keys() == environment().keys()  # the machine as hostinfo records it
    (row,) = report["results"]
    assert row["kind"] == "linear_residual" and row["candidates"] == 1 and row["accepted"] == 1
    assert [s["B"] for s in row["shapes"]] == [1, 3] and all(
        s["builtin_ms"] is None and s["best_ms"] is None for s in row["shapes"]
    )
    assert "pending" in capsys.readouterr().out
