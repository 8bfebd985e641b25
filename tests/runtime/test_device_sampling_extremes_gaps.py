"""Temperatures and top_p values at the edge of float32, which the device sampler's buffers hold: a top_p
under float32's smallest normal rounded to 0 and kept no token (the kernel wrote id 2**31 - 1, an id past any
vocabulary, for the next step's embedding), and a temperature so small that logit / T overflows made the
kernel pick index 0 (all logits -inf) or the first of several +inf logits instead of the argmax. Such rows
now sample as greedy / keep the top token, on the device as on the host."""

from __future__ import annotations

import pytest
import torch

from nonstop.engine.sampling import SamplingParams, sample
from nonstop.kernels.sample import KERNELS, sample_op
from nonstop.program.reference import REFERENCE, StepEnv
from nonstop.runtime.device_sampling import SampleRow, fill_sample_rows

V = 37


def _logits(shift: float) -> torch.Tensor:
    """[1, V] logits with one clear maximum at index 29 and every value offset by ``shift``."""
    x = torch.randn(1, V, generator=torch.Generator().manual_seed(0)).clamp(-3, 3)
    x[0, 29] = 4.0
    return x + shift


def _device_and_twin(params: SamplingParams, logits: torch.Tensor) -> list[int]:
    row = SampleRow.of(params)
    out = []
    for run in (KERNELS["sample"], REFERENCE["sample"]):
        buf = {"logits": logits.clone(), "next_ids": torch.full((1,), -7)}
        buf |= {n: torch.zeros(1, dtype=torch.int64) for n in ("sample_top_k", "sample_seed", "sample_offset")}
        buf |= {n: torch.zeros(1) for n in ("sample_temperature", "sample_top_p")}
        fill_sample_rows(buf, [row], torch.tensor([5]))
        op, _ = sample_op(V)
        run(op, StepEnv(buf, None, None))
        out.append(int(buf["next_ids"][0]))
    return out


@pytest.mark.parametrize("top_p", [1e-46, 1e-40])
def test_a_top_p_below_float32s_range_keeps_the_top_token(top_p):
    params = SamplingParams(temperature=1.0, top_p=top_p, seed=3)
    assert SampleRow.of(params).top_p > 0 and torch.tensor(SampleRow.of(params).top_p).item() > 0
    logits = _logits(0.0)
    assert _device_and_twin(params, logits) == [29, 29]
    assert sample(logits[0], params, None, position=5) == 29


@pytest.mark.parametrize(
    "temperature,shift",
    [(1e-40, -20.0), (1e-38, 30.0), (1e-31, 0.0)],
    ids=["all-negative-underflow", "positive-overflow", "just-below-floor"],
)
def test_a_temperature_that_overflows_float32_samples_as_greedy(temperature, shift):
    """Index 29 holds the largest logit; at T = 1e-38 every positive logit divided by T is +inf on the device
    (it took the first), at 1e-40 every negative one -inf (it took index 0)."""
    params = SamplingParams(temperature=temperature, seed=3)
    assert SampleRow.of(params).temperature == 0.0
    logits = _logits(shift)
    assert _device_and_twin(params, logits) == [29, 29]
    assert sample(logits[0], params, None, position=5) == 29


def test_rows_above_the_floors_keep_their_values():
    """The floors change nothing a float32 buffer can hold and divide by safely."""
    row = SampleRow.of(SamplingParams(temperature=1e-29, top_p=1e-30, seed=3))
    assert (row.temperature, row.top_p) == (1e-29, 1e-30)
    assert _device_and_twin(SamplingParams(temperature=1e-29, seed=3), _logits(0.0)) == [29, 29]
