"""How ``nonstop/plan/validation.py`` turns a published point into a prediction and a table row: every
field of the point reaches ``predict``, the point's formats override its release's, the error and the
band. ``predict`` and the workload are replaced by fakes that record what they are given."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import nonstop.plan.validation as validation


def _row(published, predicted, metric="ms_per_token"):
    prediction = SimpleNamespace(
        prefill=SimpleNamespace(bound=lambda: "prefill"), time=SimpleNamespace(bound=lambda: "decode")
    )
    return validation.Row({"id": "p", "metric": metric}, published, predicted, prediction)


def test_error_is_predicted_over_published():
    """error = predicted / published - 1: 125 predicted of 100 published is +25%, inside the band;
    80 of 100 is -20% (not 100/80 - 1 = +25%)."""
    assert _row(100.0, 125.0).error == pytest.approx(0.25) and _row(100.0, 125.0).within_band
    assert _row(100.0, 80.0).error == pytest.approx(-0.2)
    assert not _row(100.0, 126.0).within_band


def test_bound_of_a_ttft_point_is_the_prefills():
    """A time-to-first-token point is limited by its prefill, any other by the decode step."""
    assert _row(1, 1, "ttft_ms").bound == "prefill" and _row(1, 1, "prefill_ms").bound == "prefill"
    assert _row(1, 1, "ms_per_token").bound == "decode"


@pytest.fixture
def recorded(monkeypatch):
    seen = {}

    def fake_predict(workload, chip, layout, batch, context, spec, executor, consts, requests=None):
        seen.update(layout=layout, batch=batch, context=context, spec=spec, executor=executor, requests=requests)
        return "prediction"

    monkeypatch.setattr(validation, "predict", fake_predict)
    monkeypatch.setattr(validation, "_workload", lambda model, precision=(): ("workload", model, precision))
    return seen


def test_every_point_field_reaches_predict(recorded):
    """tp / dp / ep / sharding / pp / dcp, the batch, the context, the executor and the speculative
    accept/draft pair are the point's, not the defaults."""
    point = {
        "model": "kimi-k3",
        "chip": "h200",
        "tp": 4,
        "dp": 2,
        "ep": 8,
        "pp": 2,
        "dcp": 4,
        "sharding": "engine",
        "batch": 3,
        "context": 4096,
        "executor": "megakernel",
        "spec": {"accept": 2.5, "drafts": 3},
    }
    assert validation.predict_point(point) == "prediction"
    layout = recorded["layout"]
    assert (layout.tp, layout.dp, layout.ep, layout.sharding, layout.pp, layout.dcp) == (4, 2, 8, "engine", 2, 4)
    assert (recorded["batch"], recorded["context"], recorded["executor"]) == (3, 4096, "megakernel")
    assert (recorded["spec"].accept, recorded["spec"].drafts) == (2.5, 3) and recorded["requests"] is None


def test_a_serving_points_context_is_its_requests(recorded):
    """A point with input_len / output_len is priced at its requests' mean context (input + output / 2),
    whatever ``context`` says."""
    point = {"model": "kimi-k3", "chip": "h200", "batch": 1, "input_len": 1000, "output_len": 200, "context": 7}
    validation.predict_point(point)
    assert recorded["context"] == 1000 + 200 // 2 and recorded["requests"].output_len == 200


def test_the_points_formats_override_its_releases(monkeypatch):
    """``_workload``: a release's stored formats, then the point's ``precision`` on top of them."""
    import nonstop.weights.resolve

    seen = {}
    monkeypatch.setattr(nonstop.weights.resolve, "resolve_model", lambda ref: ("cfg", None))
    monkeypatch.setattr(validation, "release_formats", lambda model: {"experts": "nvfp4", "dense": "fp8"})
    monkeypatch.setattr(
        validation, "Precision", SimpleNamespace(released=lambda cfg, **formats: seen.setdefault("formats", formats))
    )
    monkeypatch.setattr(validation, "build_workload", lambda cfg, model, precision: precision)
    formats = validation._workload.__wrapped__("some-release", (("experts", "bf16"),))
    assert formats == {"experts": "bf16", "dense": "fp8"}


def test_evaluate_adds_stalls_when_asked(monkeypatch):
    """``evaluate(..., with_stalls=True)`` compares a ``stalls`` point with decode + prefill stall."""
    result = {"ms_per_token": 10.0, "prefill_stall_ms_per_token": 2.0, "chips": 1}
    monkeypatch.setattr(validation, "predict_point", lambda p, consts=None: SimpleNamespace(to_json=lambda: result))
    point = {"id": "p", "metric": "ms_per_token", "batch": 1, "stalls": True, "published": 10.0}
    assert validation.evaluate([point], with_stalls=True)[0].predicted == 12.0
    assert validation.evaluate([point])[0].predicted == 10.0
