"""``exec_check.judge_executor_run`` on hand-made logits: the bound is 4x the built-in kernel's own
deviation plus the dtype tolerance of the logits' scale; NaN logits, a candidate that the executor did not
run at every decode step, and a run that never happened are rejected."""

from __future__ import annotations

import pytest
import torch

from nonstop.tune.exec_check import judge_executor_run

TOL = (2e-4, 2e-5)
REF = [torch.tensor([[1.0, -2.0, 0.5]]), torch.tensor([[0.25, 3.0, -1.0]])]
PLANNED = {"job": {"B": 1, "T": 1, "fingerprint": "f", "tuned_calls": 6}, "reference": REF}


def builtin(dev: float = 0.0) -> dict:
    return {"fingerprint": "f", "logits": [r + dev for r in REF]}


def test_a_candidate_like_the_builtin_passes():
    assert judge_executor_run(PLANNED, builtin(0.01), {"tuned_calls": 6, "logits": [r - 0.02 for r in REF]}, TOL) == []


def test_the_bound_is_four_times_the_builtin_deviation():
    """Built-in off by 0.01 everywhere: bound = 4 * 0.01 + 2e-4 * 3 + 2e-5 = 0.04062 at step 2 (scale 3)."""
    got = {"tuned_calls": 6, "logits": [REF[0], REF[1] + 0.05]}
    (msg,) = judge_executor_run(PLANNED, builtin(0.01), got, TOL)
    assert "step 2 logits differ" in msg and "0.05 > 0.0406" in msg, msg
    ok = {"tuned_calls": 6, "logits": [REF[0], REF[1] + 0.04]}
    assert judge_executor_run(PLANNED, builtin(0.01), ok, TOL) == []


def test_nan_logits_are_rejected():
    nan = REF[1].clone()
    nan[0, 1] = float("nan")
    (msg,) = judge_executor_run(PLANNED, builtin(), {"tuned_calls": 6, "logits": [REF[0], nan]}, TOL)
    assert "step 2 logits differ" in msg and "inf" in msg, msg


def test_the_stored_candidate_must_run_at_every_decode_step():
    (msg,) = judge_executor_run(PLANNED, builtin(), {"tuned_calls": 5, "logits": list(REF)}, TOL)
    assert "ran the stored candidate 5 of 6 times" in msg, msg


def test_a_run_that_did_not_happen_is_rejected():
    (msg,) = judge_executor_run(PLANNED, builtin(), None, TOL)
    assert "did not run" in msg


def test_a_run_with_fewer_steps_of_logits_is_rejected():
    """``zip`` stopped at the shorter list: a run that returned no logits, or one step's of two, was judged on
    what it gave and accepted. The child always returns one per step; the judge no longer relies on it."""
    for logits in ([], [REF[0]]):
        (msg,) = judge_executor_run(PLANNED, builtin(), {"tuned_calls": 6, "logits": logits}, TOL)
        assert f"gave logits for {len(logits)} of 2 steps" in msg, msg
    short = {"fingerprint": "f", "logits": REF[:1]}
    with pytest.raises(RuntimeError, match="built-in executor run gave 1 of 2 steps"):
        judge_executor_run(PLANNED, short, {"tuned_calls": 6, "logits": REF}, TOL)
