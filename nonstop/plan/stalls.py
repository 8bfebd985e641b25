"""What-if: the serving points' figures as decode step + the requests' prefills (``predict.Requests``).

A point marked ``stalls`` comes from an aggregated server under a serving benchmark, so its published
TPOT carries the prefills of its wave (``(n - 1)/2 · P / (O - 1)`` a token); ``nonstop plan`` reports that
stall beside ``ms_per_token`` and the stored constants are fitted without it. This refits the constants on
the calibration points with the stall added (``calibrate.fit(with_stalls=True)``; never stored) and prints
both tables that way (docs/plan.md: why the stall is not in the fitted figure).

    python -m nonstop.plan.stalls
"""

from __future__ import annotations

import argparse

from nonstop.plan.calibrate import fit
from nonstop.plan.timing import FITTED
from nonstop.plan.validation import print_tables


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m nonstop.plan.stalls", description=__doc__.split("\n\n")[0]).parse_args(argv)
    consts, loss = fit(with_stalls=True)
    fitted = ", ".join(f"{k} {getattr(consts, k):.4g}" for k in FITTED)
    print(f"refit with prefill stalls (rms log error {loss**0.5:.3f}; not stored): {fitted}\n")
    print_tables(consts, with_stalls=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
