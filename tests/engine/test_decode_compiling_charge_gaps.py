"""``_charge_decode_compiling``: which requests a step's compile time is charged to (``decode_compiling_s``,
the part of the cpu backend's torch.compile time ``nonstop generate`` reports inside the decode speed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nonstop.engine.llm import _charge_decode_compiling


def _req(first, finished):
    return SimpleNamespace(first_token_at=first, finished_at=finished, extra_metrics={"decode_compiling_s": 0.0})


def test_only_requests_decoding_across_the_step_are_charged():
    """Step began at t=10 and compiled 2 s. Charged: first token before 10 and not finished before 10 (still
    running, or finished at/after 10). Not charged: no first token yet (its time to first token holds the
    compile; reading None as a time would be a TypeError), first token at/after 10, finished before 10."""
    reqs = {
        "running": _req(5.0, None),
        "finished_later": _req(5.0, 12.0),
        "finished_at_step": _req(5.0, 10.0),
        "no_first_token": _req(None, None),
        "first_token_at_step": _req(10.0, None),
        "first_token_after": _req(11.0, None),
        "finished_before": _req(5.0, 9.0),
    }
    _charge_decode_compiling(list(reqs.values()), 2.0, 10.0)
    charged = {name for name, r in reqs.items() if r.extra_metrics["decode_compiling_s"]}
    assert charged == {"running", "finished_later", "finished_at_step"}
    assert reqs["running"].extra_metrics["decode_compiling_s"] == pytest.approx(2.0)


def test_charges_add_up_over_steps():
    """Two compiling steps inside one decode interval add: 2 s + 0.5 s = 2.5 s."""
    r = _req(1.0, None)
    _charge_decode_compiling([r], 2.0, 3.0)
    _charge_decode_compiling([r], 0.5, 4.0)
    assert r.extra_metrics["decode_compiling_s"] == pytest.approx(2.5)
