"""``calibrate.fit`` end to end on a synthetic problem (``evaluate`` replaced by a linear stand-in with a known
exact solution): the points it is given are the ones fitted, the fixed priors come from the ``base`` it is
given, and ``with_stalls`` reaches both the optimisation and the loss it reports."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from nonstop.plan import calibrate
from nonstop.plan.timing import FITTED, Constants

STORED = Constants.load()
# the constants the points are made from: the stored ones moved by 10-30% (eta_hbm stays under one)
TRUTH = {n: getattr(STORED, n) * f for n, f in zip(FITTED, (0.9, 1.3, 0.8, 1.2))}
MIX = np.array([[1.0, 0.2, 0.0, 0.1], [0.0, 1.0, 0.3, 0.0], [0.2, 0.0, 1.0, 0.4], [0.1, 0.3, 0.0, 1.0]])


def _points():
    """Four points whose published figure is MIX @ (TRUTH / STORED): a positive mix of the fitted constants, each
    in units of its stored value."""
    truth = np.array([TRUTH[name] / getattr(STORED, name) for name in FITTED])
    return [{"id": f"p{i}", "mix": MIX[i], "published": float(MIX[i] @ truth)} for i in range(4)]


def _evaluate(points, consts, with_stalls=False):
    """Stand-in: predicted = mix @ (constants / STORED), times 1.25 when stalls are added."""
    c = np.array([getattr(consts, name) / getattr(STORED, name) for name in FITTED])
    scale = 1.25 if with_stalls else 1.0
    return [SimpleNamespace(predicted=scale * float(p["mix"] @ c), published=p["published"], point=p) for p in points]


@pytest.fixture
def base(monkeypatch):
    monkeypatch.setattr(calibrate, "evaluate", _evaluate)
    return STORED.replace(kernel_factor=STORED.kernel_factor * 1.5 + 0.25)


def test_fit_recovers_the_constants_of_the_points_it_is_given(base):
    """The given points (not the stored calibration set) are fitted: the exact solution, loss ~0; the fixed
    priors are the given base's."""
    consts, loss = calibrate.fit(_points(), base)
    assert loss < 1e-6
    for name, value in TRUTH.items():
        assert getattr(consts, name) == pytest.approx(value, rel=1e-2), name
    assert consts.kernel_factor == base.kernel_factor


def test_with_stalls_is_fitted_and_reported(base):
    """With stalls every prediction is 1.25 times larger: the fit divides every constant by 1.25 and still
    reaches loss ~0 (a loss reported without stalls would be log(1.25)^2 = 0.05)."""
    consts, loss = calibrate.fit(_points(), base, with_stalls=True)
    assert loss < 1e-6
    for name, value in TRUTH.items():
        assert getattr(consts, name) == pytest.approx(value / 1.25, rel=1e-2), name
