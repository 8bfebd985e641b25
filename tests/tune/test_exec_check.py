"""The executor run's parts that need no child: the weight fingerprint both sides compare."""

from __future__ import annotations

import pytest
import torch

from nonstop.model.build import random_model
from nonstop.tune.exec_check import fingerprint
from nonstop.tune.target import make_target
from nonstop.weights.resolve import resolve_model

# a k3-nano linear_residual executor model whose float64 weight sums differed between 1 and 2 threads
SEED = 1797491558


@pytest.fixture
def threads():
    """Set torch's intra-op thread count; restored afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _model():
    cfg, _ = resolve_model("k3-nano")
    target = make_target("linear_residual", "k3-nano", cfg, torch.float32, torch.device("cpu"), [1])
    return random_model(target.cfg, torch.float32, device="cpu", seed=SEED)


def test_fingerprint_does_not_depend_on_the_thread_count(threads):
    model = _model()
    threads(1)
    one = fingerprint(model)
    threads(2)
    assert fingerprint(model) == one


def test_fingerprint_sees_one_ulp(threads):
    threads(2)
    model = _model()
    before = fingerprint(model)
    w = next(t for t in model.state_dict().values() if t.is_floating_point() and t.numel() > 1)
    flat = w.view(-1)
    with torch.no_grad():
        flat[flat.numel() // 2] = torch.nextafter(flat[flat.numel() // 2], torch.tensor(float("inf")))
    assert fingerprint(model) != before


def test_wrong_logits_in_the_executor_run_say_the_candidate_is_wrong_in_the_model():
    """The model runs op variants and attributes the verification calls may not have: the message says the
    candidate is wrong there, not that it cheats."""
    from nonstop.tune.exec_check import judge_executor_run

    reference = [torch.zeros(2, 5)]
    planned = {"job": {"B": 2, "T": 1, "fingerprint": "f", "tuned_calls": 3}, "reference": reference}
    builtin = {"fingerprint": "f", "logits": reference}
    got = {"tuned_calls": 3, "logits": [torch.ones(2, 5)]}
    (message,) = judge_executor_run(planned, builtin, got, (2e-4, 2e-5))
    assert "step 1 logits differ" in message and "the candidate is wrong in the model" in message, message
