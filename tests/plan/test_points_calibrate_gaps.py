"""The planner's data side: a published point's metric and command line (``points.py``), the fit's
optimiser and constants (``calibrate.py``), released names (``releases.py``). Expected values are hand
arithmetic on small made-up inputs."""

import json
import math

import numpy as np
import pytest

from nonstop.plan.calibrate import _constants, nelder_mead
from nonstop.plan.points import load_points, metric_value, plan_argv
from nonstop.plan.releases import find_release, other_publishers, release_formats
from nonstop.plan.timing import FITTED, Constants

RESULT = {
    "ms_per_token": 10.0,
    "prefill_stall_ms_per_token": 2.0,
    "tokens_per_s_per_user": 100.0,
    "tokens_per_s_total": 800.0,
    "tokens_per_s_per_chip": 100.0,
    "chips": 8,
    "prefill_ms": 50.0,
    "ttft_ms": 60.0,
}


def _point(metric, **kw):
    return {"id": "p", "metric": metric, "batch": 8, **kw}


@pytest.mark.parametrize(
    "metric, expected",
    [
        ("ms_per_token", 12.0),
        ("tokens_per_s_per_user", 1000 / 12),
        ("tokens_per_s_total", 8 * 1000 / 12),
        ("tokens_per_s_per_chip", 8 * 1000 / 12 / 8),
        ("prefill_ms", 50.0),  # a time to first token carries no decode stall
        ("ttft_ms", 60.0),
    ],
)
def test_stalls_add_the_prefill_stall_to_each_token(metric, expected):
    """``with_stalls`` on a ``stalls`` point: 10 ms decode + 2 ms stall = 12 ms a token, and the rates
    follow from it (per chip: the total over the result's 8 chips); prefill figures are untouched."""
    point = _point(metric, stalls=True)
    assert metric_value(RESULT, point, with_stalls=True) == pytest.approx(expected)
    assert metric_value(RESULT, point) == RESULT[metric]  # default: the decode figure alone


def test_no_stall_is_added_to_a_point_without_stalls():
    """Only a point marked ``stalls`` carries other requests' prefills."""
    assert metric_value(RESULT, _point("ms_per_token"), with_stalls=True) == 10.0


def test_closed_loop_throughput_counts_the_ttft_once():
    """tokens_per_s_total_with_ttft = batch x n / (ttft + (n - 1) x ms_per_token):
    4 x 101 / ((200 + 100 x 10) ms) = 404 / 1.2 s."""
    point = {"id": "p", "metric": "tokens_per_s_total_with_ttft", "batch": 4, "output_len": 101, "ttft_ms": 200.0}
    assert metric_value(RESULT, point) == pytest.approx(404 / 1.2)


def test_unknown_metric_is_refused():
    """A typo in a point's metric is an error naming the point, not a KeyError or a silent figure."""
    with pytest.raises(ValueError, match="unknown metric 'ms_per_tok'"):
        metric_value({**RESULT, "ms_per_tok": 1.0}, _point("ms_per_tok"))


def test_plan_argv_spells_every_flag():
    """The command line of a point: layout flags default to 1, context to 1024, the precision's flag,
    the speculative accept and draft counts in that order."""
    point = {
        "model": "kimi-k3",
        "chip": "b200",
        "chips": 8,
        "tp": 8,
        "batch": 4,
        "precision": {"experts": "nvfp4"},
        "spec": {"accept": 2.5, "drafts": 3},
    }
    assert plan_argv(point) == [
        "plan", "-m", "kimi-k3", "--chip", "b200", "--chips", "8",
        "--tp", "8", "--dp", "1", "--ep", "1", "--pp", "1", "--dcp", "1",
        "--batch", "4", "--context", "1024", "--executor", "kernels", "--sharding", "production",
        "--experts", "nvfp4", "--spec-accept", "2.5", "--spec-draft", "3", "--json",
    ]  # fmt: skip


def test_load_points_filters_by_role(tmp_path):
    """``load_points(role)`` keeps that role's points only; None keeps them all."""
    path = tmp_path / "v.json"
    points = [{"id": "a", "role": "calibration"}, {"id": "b", "role": "other"}]
    path.write_text(json.dumps({"points": points}))
    assert [p["id"] for p in load_points("calibration", path)] == ["a"]
    assert [p["id"] for p in load_points(None, path)] == ["a", "b"]


def test_nelder_mead_finds_a_quadratics_minimum():
    """The fit's optimiser on (x - 1)^2 + 3 (y + 2)^2 + 0.5 from (0, 0): the minimum (1, -2)."""
    f = lambda x: (x[0] - 1) ** 2 + 3 * (x[1] + 2) ** 2 + 0.5  # noqa: E731
    best = nelder_mead(f, np.array([0.0, 0.0]), iters=2000, tol=1e-14)
    assert best == pytest.approx([1.0, -2.0], abs=1e-3)


def test_fitted_constants_keep_eta_hbm_at_most_one():
    """``eta_hbm`` is a share of the peak bandwidth: exp(log 2) is clamped to 1; the others are exp(x)."""
    base = Constants.load()
    x = np.array([math.log(2.0)] * len(FITTED))
    consts = _constants(base, x)
    assert consts.eta_hbm == 1.0
    for name in FITTED:
        if name != "eta_hbm":
            assert getattr(consts, name) == pytest.approx(2.0)


def test_release_names_trim_case_and_publishers():
    """Names compare trimmed and case-insensitively; another publisher's name for a release is none, and
    is pointed at the publisher that has it; the formats handed back are a copy."""
    assert find_release("  Kimi-K2.5 \n") is find_release("moonshotai/kimi-k2.5") is not None
    assert find_release("nvidia/kimi-k2.5") is None
    assert other_publishers("nvidia/Kimi-K2.5") == ["moonshotai/kimi-k2.5"]
    assert other_publishers("nvidia/kimi-k2.5-nvfp4") == []  # a release of its own
    formats = release_formats("nvidia/Kimi-K3-NVFP4")
    assert formats == {"experts": "nvfp4"}
    formats["experts"] = "bf16"
    assert release_formats("nvidia/Kimi-K3-NVFP4") == {"experts": "nvfp4"}
