"""Fit the shared efficiency constants on the calibration points (``validation.json``; the held-out
points of ``heldout.json`` are never read here).

Objective: the mean squared log error of the predictions, log(predicted / published), over every
calibration point, minimised by Nelder-Mead over the logarithms of the fitted constants
(``timing.FITTED``; ``eta_hbm`` kept in (0, 1]). One set of constants for every point: nothing is
fitted per chip, system or point.

    python -m nonstop.plan.calibrate           # fit and print the table
    python -m nonstop.plan.calibrate --write   # ... and store the constants in constants.json
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from nonstop.plan.points import load_points
from nonstop.plan.timing import CONSTANTS, FITTED, Constants
from nonstop.plan.validation import evaluate, table


def _constants(base: Constants, x: np.ndarray) -> Constants:
    values = {name: float(math.exp(v)) for name, v in zip(FITTED, x)}
    values["eta_hbm"] = min(values["eta_hbm"], 1.0)
    return base.replace(**values)


def x0(base: Constants | None = None) -> np.ndarray:
    """The logarithms of the fitted constants (default: the stored ones)."""
    base = base or Constants.load()
    return np.array([math.log(getattr(base, name)) for name in FITTED])


def objective(points: list[dict], base: Constants | None, x: np.ndarray, with_stalls: bool = False) -> float:
    rows = evaluate(points, _constants(base or Constants.load(), x), with_stalls)
    return float(np.mean([math.log(r.predicted / r.published) ** 2 for r in rows]))


def nelder_mead(f, x0: np.ndarray, step: float = 0.3, iters: int = 600, tol: float = 1e-7) -> np.ndarray:
    """Plain Nelder-Mead (reflection 1, expansion 2, contraction 0.5, shrink 0.5)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (s - simplex[0]) for s in simplex[1:]]
                values = [values[0]] + [f(s) for s in simplex[1:]]
    return simplex[int(np.argmin(values))]


def fit(
    points: list[dict] | None = None, base: Constants | None = None, with_stalls: bool = False
) -> tuple[Constants, float]:
    """``with_stalls``: fit the serving points' figures as decode step + other requests' prefills
    (``points.metric_value``): a what-if, never stored (``ms_per_token`` is the decode figure)."""
    points = points or load_points("calibration")
    base = base or Constants.load()
    best = nelder_mead(lambda x: objective(points, base, x, with_stalls), x0(base))
    for _ in range(2):  # restart from the optimum: Nelder-Mead can stall on a degenerate simplex
        best = nelder_mead(lambda x: objective(points, base, x, with_stalls), best, step=0.1)
    consts = _constants(base, best)
    return consts, objective(points, base, best, with_stalls)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nonstop.plan.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--write", action="store_true", help="store the fitted constants in nonstop/plan/constants.json"
    )
    args = parser.parse_args(argv)
    t0 = time.time()
    points = load_points("calibration")
    consts, loss = fit(points)
    rows = evaluate(points, consts)
    print(table(rows))
    worst = max(abs(r.error) for r in rows)
    print(
        f"\nfitted in {time.time() - t0:.0f} s on {len(points)} points: "
        f"rms log error {math.sqrt(loss):.3f}, worst |error| {worst:.1%}"
    )
    for name in ("eta_hbm", "eta_flops", "kernel_factor", *FITTED[1:]):
        print(f"  {name:<16} {getattr(consts, name):.4g}{'' if name in FITTED else '  (fixed prior)'}")
    if args.write:
        data = json.loads(CONSTANTS.read_text())
        data.update({name: round(getattr(consts, name), 4) for name in FITTED})
        data["fit"] = {
            "points": [p["id"] for p in points],
            "rms_log_error": round(math.sqrt(loss), 4),
            "worst_abs_error": round(worst, 4),
        }
        CONSTANTS.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {CONSTANTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
