"""``nonstop.train.plot`` had no test: the trailing moving average and the PNG writer."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from nonstop.train.plot import plot_loss_curve, smooth


def _trailing_mean(values, window):
    """Plain-loop reference: the mean of the last ``window`` values up to and including each point."""
    out = []
    for i in range(len(values)):
        part = values[max(0, i + 1 - window) : i + 1]
        out.append(sum(part) / len(part))
    return out


def test_smooth_is_a_trailing_mean_shorter_at_the_start():
    """smooth([1, 2, 3, 4, 10], 2) = [1, 1.5, 2.5, 3.5, 7]: the first point averages only itself (a window that
    reached before the start, or a fixed divisor, gives wrong leading values)."""
    np.testing.assert_allclose(smooth([1, 2, 3, 4, 10], 2), [1, 1.5, 2.5, 3.5, 7])
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    for window in (3, 5, 8, 25):
        np.testing.assert_allclose(smooth(values, window), _trailing_mean(values, window))


@pytest.mark.parametrize("window", [0, 1])
def test_a_window_of_one_or_less_returns_the_values(window):
    """A window of 1 (or 0) is no smoothing: the values come back unchanged, not divided by zero (NaN)."""
    np.testing.assert_array_equal(smooth([2.0, 4.0, 8.0], window), [2.0, 4.0, 8.0])
    assert len(smooth([], 25)) == 0


def test_the_loss_curve_png_is_written_into_a_new_folder(tmp_path):
    """plot_loss_curve makes the output's folder and returns the path of a PNG it wrote."""
    pytest.importorskip("matplotlib")
    history = [{"tokens": 1000 * (i + 1), "loss": 5.0 - 0.01 * i} for i in range(40)]
    evals = [
        {"tokens": 20000, "heldout_nll": 4.9},
        {"tokens": 40000, "heldout_nll": 4.7},
    ]
    out = tmp_path / "run" / "plots" / "loss_curve.png"
    got = plot_loss_curve(history, evals, out, title="t", eval_tokens=512, final=(40000, 4.6, "final"))
    assert got == out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_no_plot_is_made(tmp_path, monkeypatch):
    """Without matplotlib the plot is skipped (None), not an ImportError that ends the training run's report."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "loss_curve.png"
    assert plot_loss_curve([{"tokens": 1, "loss": 1.0}], [], out) is None
    assert not out.exists()
