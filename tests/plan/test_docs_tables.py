"""docs/plan.md's calibration and held-out tables state what the planner predicts today.

The tables are pasted from ``python -m nonstop.plan.validation``; a change to the model or the constants
that moves a prediction must move the docs with it. Each table lists every point of its file once (grouped
by source, so a row is matched to the first unmatched point of its published figure, as rounded): the predicted figure
and the error must be the planner's, to the digits shown.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nonstop.plan.points import load_heldout, load_points
from nonstop.plan.validation import evaluate

DOC = Path(__file__).resolve().parents[2] / "docs" / "plan.md"
SHORT_BOUNDS = {"launch/sync overhead": "launch/sync", "HBM bandwidth (weights)": "HBM"}  # the tables' short names


def _table_after(heading: str) -> list[list[str]]:
    """The cells of the first table under ``heading`` (its header and rule rows dropped)."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#") and heading in line)
    rows, seen = [], False
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            seen = True
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif seen:
            break
    return rows[2:]


def _number(cell: str) -> tuple[float, float]:
    """(value, half a unit of its last digit) of a cell such as '11,635', '2.84' or '−24.0%'."""
    text = cell.replace(",", "").replace("−", "-").rstrip("%")
    decimals = len(text.split(".")[1]) if "." in text else 0
    return float(text), 0.5 * 10.0**-decimals


@pytest.mark.parametrize("heading, load", [("Calibration", load_points), ("Held out", load_heldout)])
def test_docs_tables_state_the_current_predictions(heading, load):
    points = load()
    table = _table_after(heading)
    assert len(table) == len(points), f"docs/plan.md's {heading} table has {len(table)} rows for {len(points)} points"
    unmatched = evaluate(points)
    for cells in table:
        name, (published, half) = cells[0], _number(cells[2])
        row = next((r for r in unmatched if abs(r.published - published) <= half * 1.001), None)
        assert row is not None, f"{name}: no point of {heading} publishes {cells[2]}"
        unmatched.remove(row)
        predicted, half = _number(cells[3])
        assert abs(predicted - row.predicted) <= half * 1.001, f"{name}: docs {cells[3]}, planner {row.predicted:.4g}"
        error, half = _number(cells[4])
        assert abs(error - 100 * row.error) <= half * 1.001 + 1e-9, f"{name}: docs {cells[4]}, planner {row.error:+.2%}"
        bound = "known miss" if row.point.get("known_miss") else SHORT_BOUNDS.get(row.bound, row.bound)
        assert cells[5] == bound, f"{name}: docs say bound {cells[5]!r}, planner {bound!r}"
