"""Published decode results as data: the calibration points (``validation.json``), the held-out points
(``heldout.json``, never read by the calibration), and how one point becomes a ``nonstop plan`` command
line and a number to compare.

A point names the model (a preset, or a config under ``plan/models/``), the chip, the layout in ranks, the
batch (concurrent sequences), the mean cached context, the executor, the serving formats where they differ
from the checkpoint's, speculative decoding, and the published ``metric``:

    ms_per_token | tokens_per_s_per_user | tokens_per_s_total | tokens_per_s_per_chip     the planner's own
    tokens_per_s_total_with_ttft = batch · n / (ttft + (n - 1) · ms_per_token)             closed-loop serving

    prefill_ms | ttft_ms                                                                   time to first token

``tokens_per_s_total_with_ttft`` is a serving benchmark's output throughput, which counts each request's time
to first token (``ttft_ms``, published beside it) for its ``output_len`` = n generated tokens;
``prefill_ms`` is a published time to first token at concurrency 1 (one request served alone) and
``ttft_ms`` a mean one at the point's concurrency, for a point that names its requests' ``input_len`` and
``output_len``.
``stalls``: the published figure comes from an aggregated server under a serving benchmark, so it carries
other requests' prefills (``predict.Requests``); ``python -m nonstop.plan.stalls`` adds
them, the default compares the decode figure alone.
"""

from __future__ import annotations

import json
from pathlib import Path

POINTS = Path(__file__).with_name("validation.json")
HELDOUT = Path(__file__).with_name("heldout.json")
TTFT_METRICS = ("prefill_ms", "ttft_ms")  # a prefill's figures (``Prediction.prefill``), not the decode step's
METRICS = (
    "ms_per_token",
    "tokens_per_s_per_user",
    "tokens_per_s_total",
    "tokens_per_s_per_chip",
    "tokens_per_s_total_with_ttft",
    *TTFT_METRICS,
)
# serving-format keys of a point's "precision" and the ``nonstop plan`` flag of each
PRECISION_FLAGS = {
    "dense": "--weights",
    "experts": "--experts",
    "cache": "--kv-cache",
    "attention": "--attention-weights",
}


def load_points(role: str | None = None, path: Path = POINTS) -> list[dict]:
    points = json.loads(Path(path).read_text())["points"]
    return [p for p in points if role is None or p["role"] == role]


def load_heldout(path: Path = HELDOUT) -> list[dict]:
    return load_points(None, path)


def plan_argv(point: dict) -> list[str]:
    """The ``nonstop plan ... --json`` command line that predicts ``point``."""
    argv = ["plan", "-m", point["model"], "--chip", point["chip"], "--chips", str(point["chips"])]
    for flag in ("tp", "dp", "ep", "pp", "dcp"):
        argv += [f"--{flag}", str(point.get(flag, 1))]
    argv += ["--batch", str(point["batch"])]
    if "input_len" in point:  # a serving benchmark's lengths: the context is input + output / 2
        argv += ["--input-len", str(point["input_len"]), "--output-len", str(point["output_len"])]
    else:
        argv += ["--context", str(point.get("context", 1024))]
    argv += ["--executor", point.get("executor", "kernels"), "--sharding", point.get("sharding", "production")]
    for key, value in (point.get("precision") or {}).items():
        argv += [PRECISION_FLAGS[key], value]
    if point.get("spec"):
        argv += ["--spec-accept", str(point["spec"]["accept"]), "--spec-draft", str(point["spec"]["drafts"])]
    return argv + ["--json"]


def metric_value(result: dict, point: dict, with_stalls: bool = False) -> float:
    """The point's metric from a prediction's JSON (``Prediction.to_json`` / ``nonstop plan --json``).
    ``with_stalls``: for a point whose published figure carries other requests' prefills (``stalls``, an
    aggregated server's serving benchmark), add the predicted ``prefill_stall_ms_per_token`` to each token."""
    metric = point["metric"]
    if metric not in METRICS:
        raise ValueError(f"point {point['id']}: unknown metric {metric!r}")
    if with_stalls and point.get("stalls") and metric not in TTFT_METRICS:
        ms = result["ms_per_token"] + result["prefill_stall_ms_per_token"]
        per_user = 1e3 / ms
        total = point["batch"] * per_user
        stalled = {"ms_per_token": ms, "tokens_per_s_per_user": per_user, "tokens_per_s_total": total}
        result = {**result, **stalled, "tokens_per_s_per_chip": total / result["chips"]}
    if metric == "tokens_per_s_total_with_ttft":
        n = point["output_len"]
        seconds = (point["ttft_ms"] + (n - 1) * result["ms_per_token"]) * 1e-3
        return point["batch"] * n / seconds
    return result[metric]
