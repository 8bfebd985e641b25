"""Held-out published decode results (nonstop/plan/heldout.json), predicted through ``nonstop plan --json``.

Every point runs the command line ``points.plan_argv`` builds for it and reads its metric from the JSON the
command prints; the table (point, published, predicted, error) is printed. A point must land within 25%
unless it is marked ``known_miss`` with its reason: a known miss is reported, and must still be outside
the band (one that comes back inside loses its mark). The calibration never reads this file.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from nonstop.cli import main
from nonstop.plan import points as points_module
from nonstop.plan.points import load_heldout, load_points, metric_value, plan_argv
from nonstop.plan.timing import CONSTANTS
from nonstop.plan.validation import BAND, evaluate

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _run_cli(point: dict) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(plan_argv(point)) == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def rows():
    """(point, the command's JSON, predicted metric) for every held-out point."""
    result = []
    for point in load_heldout():
        out = _run_cli(point)
        result.append((point, out, metric_value(out, point)))
    return result


def _table(rows) -> str:
    lines = [f"{'held-out point':<30} {'metric':<28} {'published':>10} {'predicted':>10} {'error':>7}"]
    for point, _, predicted in rows:
        error = predicted / point["published"] - 1
        mark = "  KNOWN MISS" if point.get("known_miss") else ""
        lines.append(
            f"{point['id']:<30} {point['metric']:<28} {point['published']:>10.2f} {predicted:>10.2f}"
            f" {error:>+7.1%}{mark}"
        )
    return "\n".join(lines)


def test_heldout_within_25_percent_or_a_known_miss(rows, report_table):
    report_table(_table(rows))
    errors = {p["id"]: (predicted / p["published"] - 1, p.get("known_miss")) for p, _, predicted in rows}
    unmarked = [f"{k} {e:+.1%}" for k, (e, miss) in errors.items() if abs(e) > BAND and not miss]
    assert not unmarked, f"held-out predictions off by more than 25%: {unmarked}"
    misses = [p for p, _, _ in rows if p.get("known_miss")]
    back_inside = [p["id"] for p in misses if abs(errors[p["id"]][0]) <= BAND]
    assert not back_inside, f"known misses now within 25% (remove their mark): {back_inside}"
    assert all(len(p["known_miss"]) > 80 for p in misses), "a known miss must say why"


def test_the_command_line_and_the_validation_table_agree(rows):
    """``python -m nonstop.plan.validation`` (docs/plan.md's table) predicts what ``nonstop plan --json`` does."""
    table = {r.point["id"]: r.predicted for r in evaluate([p for p, _, _ in rows])}
    for point, out, predicted in rows:
        assert table[point["id"]] == pytest.approx(predicted, rel=1e-9)
        assert out["fits"], f"{point['id']}: the published deployment does not fit the planner's memory model"


def test_heldout_points_are_cited_and_never_calibrated(rows, monkeypatch):
    calibration = load_points("calibration")
    assert {p["role"] for p in load_points()} == {"calibration"}  # validation.json holds only what is fitted
    assert {p["role"] for p, _, _ in rows} == {"heldout"}
    ids = [p["id"] for p, _, _ in rows]
    assert len(set(ids)) == len(ids) and not set(ids) & {p["id"] for p in calibration}
    assert not set(ids) & set(json.loads(CONSTANTS.read_text())["fit"]["points"])
    for point, _, _ in rows:
        assert len(point["source"]) > 40 and point.get("assumptions"), point["id"]
    monkeypatch.setattr(points_module, "HELDOUT", points_module.HELDOUT.with_name("missing.json"))
    from nonstop.plan.calibrate import objective, x0

    assert objective(calibration, None, x0()) > 0  # the fit's loss needs no held-out file


def test_ttft_metric_counts_each_request_time_to_first_token():
    point = {"id": "t", "metric": "tokens_per_s_total_with_ttft", "batch": 4, "output_len": 101, "ttft_ms": 1000.0}
    # 101 tokens per request in 1 s + 100 x 10 ms = 2 s, 4 requests at a time
    assert metric_value({"ms_per_token": 10.0}, point) == pytest.approx(4 * 101 / 2.0)
    with pytest.raises(ValueError, match="unknown metric"):
        metric_value({}, {"id": "t", "metric": "tokens_per_watt"})
