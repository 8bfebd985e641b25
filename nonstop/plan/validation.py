"""The planner's predictions of the published decode results (``points.py``: ``validation.json`` for the
calibration, ``heldout.json`` for the held-out checks) and the tables docs/plan.md prints.

``evaluate(points)`` predicts every point through the same code as ``nonstop plan`` (``predict``) and returns
rows of (point, published, predicted, error = predicted / published - 1).

    python -m nonstop.plan.validation [--what-if]
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from nonstop.plan.chips import get_chip
from nonstop.plan.layout import Layout
from nonstop.plan.points import TTFT_METRICS, load_heldout, load_points, metric_value
from nonstop.plan.predict import Prediction, Requests, Spec, predict
from nonstop.plan.releases import model_ref, release_formats
from nonstop.plan.timing import Constants
from nonstop.plan.workload import Precision, build_workload

BAND = 0.25  # the acceptance band: |predicted / published - 1| <= 25%


@dataclass
class Row:
    point: dict
    published: float
    predicted: float
    prediction: Prediction

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1.0

    @property
    def bound(self) -> str:
        """What limits the predicted step: the prefill's for a time-to-first-token point, else the decode's."""
        step = self.prediction.prefill if self.point["metric"] in TTFT_METRICS else self.prediction.time
        return step.bound()

    @property
    def within_band(self) -> bool:
        return abs(self.error) <= BAND


@functools.lru_cache(maxsize=16)
def _workload(model: str, precision: tuple = ()):
    from nonstop.weights.resolve import resolve_model

    cfg, _ = resolve_model(model_ref(model))
    formats = {**release_formats(model), **dict(precision)}
    return build_workload(cfg, model, Precision.released(cfg, **formats))


def predict_point(point: dict, consts: Constants | None = None) -> Prediction:
    spec = Spec(**point["spec"]) if point.get("spec") else None
    layout = Layout(
        point.get("tp", 1),
        point.get("dp", 1),
        point.get("ep", 1),
        point.get("sharding", "production"),
        point.get("pp", 1),
        point.get("dcp", 1),
    )
    chip = get_chip(point["chip"])
    workload = _workload(point["model"], tuple(sorted((point.get("precision") or {}).items())))
    requests = None
    if "input_len" in point:
        requests = Requests(point["input_len"], point["output_len"])
    return predict(
        workload,
        chip,
        layout,
        point["batch"],
        requests.context if requests else point.get("context", 1024),
        spec,
        point.get("executor", "kernels"),
        consts,
        requests=requests,
    )


def evaluate(points: list[dict], consts: Constants | None = None, with_stalls: bool = False) -> list[Row]:
    rows = []
    for p in points:
        pred = predict_point(p, consts)
        rows.append(Row(p, p["published"], metric_value(pred.to_json(), p, with_stalls), pred))
    return rows


def table(rows: list[Row]) -> str:
    width = max([len("point"), *(len(r.point["id"]) for r in rows)])
    lines = [f"{'point':<{width}} {'role':<11} {'metric':<28} {'published':>10} {'predicted':>10} {'error':>7}  bound"]
    for r in rows:
        miss = "  KNOWN MISS" if r.point.get("known_miss") else ""
        lines.append(
            f"{r.point['id']:<{width}} {r.point['role']:<11} {r.point['metric']:<28} {r.published:>10.2f}"
            f" {r.predicted:>10.2f} {r.error:>+7.1%}  {r.bound}{miss}"
        )
    return "\n".join(lines)


def what_if(chips: int = 128, tps: tuple[int, ...] = (8, 16, 32)) -> list[tuple]:
    """The seed report's 5.85 ms/token on 128 chips of unstated type: K3 at batch 1 on each catalogue chip,
    attention TP over ``tps`` with every expert spread (EP = all ranks), both executors."""
    from nonstop.plan.chips import chip_names

    workload = _workload("kimi-k3", ())
    rows = []
    for name in chip_names():
        if name == "cpu":
            continue
        chip = get_chip(name)
        ranks = chips * chip.devices_per_chip
        for executor in ("kernels", "megakernel"):
            preds = [predict(workload, chip, Layout(tp, ranks // tp, ranks), 1, 4096, None, executor) for tp in tps]
            best = min((p for p in preds if p.fits), key=lambda p: p.ms_per_token)
            rows.append((name, executor, best.layout.describe(), best.ms_per_token, best.time.bound()))
    return rows


def print_tables(consts: Constants | None = None, with_stalls: bool = False) -> None:
    """Both tables, each with its count within the band."""
    for points in (load_points(), load_heldout()):
        rows = evaluate(points, consts, with_stalls)
        print(table(rows))
        print(f"{sum(r.within_band for r in rows)} of {len(rows)} within {BAND:.0%}\n")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m nonstop.plan.validation",
        description="Print the planner's predictions of the calibration (validation.json) and held-out "
        "(heldout.json) points.",
    )
    parser.add_argument(
        "--what-if",
        action="store_true",
        help="also K3 at batch 1 on 128 chips of each kind (the seed report's 5.85 ms/token)",
    )
    args = parser.parse_args(argv)
    print_tables()
    if args.what_if:
        print()
        print(f"{'chip':<8} {'executor':<11} {'layout':<18} {'ms/token':>8}  bound")
        for name, executor, layout, ms, bound in what_if():
            print(f"{name:<8} {executor:<11} {layout:<18} {ms:>8.2f}  {bound}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
