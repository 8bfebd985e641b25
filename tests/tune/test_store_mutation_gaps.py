"""Keeping the fastest verified candidate: ``store.record`` / ``store.better`` (a timed entry beats an untimed
one and a slower one, never a faster one) and ``loop._keep`` / ``loop._store`` (a candidate is best for a
shape only where its median beats the built-in's and the best so far; each shape stores its own winner)."""

from __future__ import annotations

import json
from pathlib import Path

from nonstop.tune import store
from nonstop.tune.candidate import Candidate, Outcome
from nonstop.tune.loop import Report, _keep, _store
from tests.tune.helpers import tiny_target

KEY = "B1xT1 w=8x8 float32"


def entry(ms: float | None) -> dict:
    return {"proposer": "test", "round": 1, "candidate": "r1c1", "timed": ms is not None, "time_ms": ms}


def stored(path: Path, key: str = KEY) -> tuple[str, float | None]:
    e = json.loads(path.read_text())["entries"]["cpu"]["mlp"][key]
    return (path.parent / e["kernel"]).read_text(), e["time_ms"]


def test_the_store_keeps_the_fastest_timed_entry(tmp_path):
    path = tmp_path / "tuning.json"
    assert store.record(path, "cpu", "mlp", KEY, "# untimed\n", entry(None))
    assert store.record(path, "cpu", "mlp", KEY, "# 2 ms\n", entry(2.0))  # timed beats untimed
    assert stored(path) == ("# 2 ms\n", 2.0)
    assert store.record(path, "cpu", "mlp", KEY, "# 1 ms\n", entry(1.0))  # faster beats slower
    assert not store.record(path, "cpu", "mlp", KEY, "# 3 ms\n", entry(3.0))  # slower does not
    assert not store.record(path, "cpu", "mlp", KEY, "# 1 ms again\n", entry(1.0))  # a tie keeps the first
    assert not store.record(path, "cpu", "mlp", KEY, "# untimed again\n", entry(None))  # untimed never beats timed
    assert stored(path) == ("# 1 ms\n", 1.0)


def outcome(cid: str, **ms: float) -> Outcome:
    timing = {k.replace("_", " "): {"median_ms": v} for k, v in ms.items()}
    return Outcome(Candidate(cid, f"# {cid}\n", "test"), True, [], timing, {})


def test_keep_needs_a_median_below_the_builtin_and_the_best_so_far():
    report = Report(tiny_target("linear_residual"), "test")
    report.baseline = {"s1": {"median_ms": 2.0, "floor_ms": 0.1}, "s2": {"median_ms": 2.0, "floor_ms": 0.1}}
    assert _keep(report, outcome("r1c1", s1=3.0, s2=1.5), ["s1", "s2"]) == ["s2"]  # slower than built-in at s1
    assert _keep(report, outcome("r1c2", s1=1.0, s2=1.8), ["s1", "s2"]) == ["s1"]  # s2: 1.8 > best 1.5
    assert _keep(report, outcome("r1c3", s1=0.5, s2=1.0), ["s1", "s2"]) == ["s1", "s2"]
    assert {k: v[0].candidate.id for k, v in report.best.items()} == {"s1": "r1c3", "s2": "r1c3"}


def test_keep_without_a_gpu_keeps_the_first_verified_candidate():
    report = Report(tiny_target("linear_residual"), "test")
    assert _keep(report, outcome("r1c1"), ["s1"]) == ["s1"]
    assert _keep(report, outcome("r1c2"), ["s1"]) == []
    assert report.best["s1"][0].candidate.id == "r1c1" and report.best["s1"][1] is None


def test_each_shape_stores_its_own_winner(tmp_path):
    target = tiny_target("linear_residual")
    report = Report(target, "test")
    report.baseline = {"s1": {"median_ms": 2.0, "floor_ms": 0.1}, "s2": {"median_ms": 2.0, "floor_ms": 0.1}}
    path = tmp_path / "tuning.json"
    _keep(report, outcome("r1c1", s1=1.0, s2=1.9), ["s1", "s2"])
    _keep(report, outcome("r1c2", s1=1.5, s2=1.0), ["s1", "s2"])  # best at s2 only
    _store(report, path, target, ["s1", "s2"])
    entries = json.loads(path.read_text())["entries"]
    (shapes,) = [kinds["linear_residual"] for kinds in entries.values()]
    assert {k: (e["candidate"], e["time_ms"]) for k, e in shapes.items()} == {"s1": ("r1c1", 1.0), "s2": ("r1c2", 1.0)}
    assert (path.parent / shapes["s2"]["kernel"]).read_text() == "# r1c2\n"


def test_tune_verify_exits_1_when_the_candidate_is_rejected(tmp_path, capsys):
    """``nonstop tune verify``: exit 0 accepted, 1 rejected (here at the static stage: no child runs)."""
    from nonstop.cli import main

    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom nonstop.kernels.dense import linear_residual as launch\n")
    assert main(["tune", "verify", "--op", "linear_residual", "--kernel", str(bad), "--device", "cpu"]) == 1
    assert "REJECTED (static)" in capsys.readouterr().out
