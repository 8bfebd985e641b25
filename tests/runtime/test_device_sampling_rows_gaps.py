"""Gaps a mutation audit of ``runtime/device_sampling.py`` found: how a request's ``SamplingParams`` become
the device sampler's row (``SampleRow.of``) and the Philox key of a seed (``philox_key``), checked against
hand arithmetic (seed mod 2^64 as a two's-complement int64)."""

from __future__ import annotations

import pytest
import torch

from nonstop.engine.sampling import SamplingParams
from nonstop.runtime.device_sampling import SampleRow, philox_key


@pytest.mark.parametrize(
    "seed, key",
    [
        (0, 0),
        (5, 5),
        (2**63 - 1, 2**63 - 1),
        (2**63, -(2**63)),
        (2**64 - 1, -1),
        (-1, -1),
        (2**64 + 5, 5),
        (-(2**63), -(2**63)),
    ],
)
def test_philox_key_is_the_seed_mod_2_to_the_64_as_an_int64(seed, key):
    """A key computed with the wrong half-range offset (not 2^63) maps small seeds to other keys: a seeded
    request then draws different noise on the device than on the host."""
    assert philox_key(seed) == key


def test_a_seed_of_zero_is_a_seed():
    """``seed=0`` is a real seed (reproducible): a truthiness check (``if params.seed``) would draw it a random key
    instead, so two runs of the same seeded request would differ."""
    gen_a, gen_b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    params = SamplingParams(temperature=0.8, seed=0)
    assert SampleRow.of(params, gen_a).seed == 0
    assert SampleRow.of(params, gen_b).seed == 0
    assert SampleRow.of(params).seed == 0


def test_the_row_carries_every_sampling_parameter():
    """temperature, top_k and top_p reach the device row unchanged (a dropped one samples unfiltered)."""
    row = SampleRow.of(SamplingParams(temperature=0.75, top_k=7, top_p=0.6, seed=2**64 - 3))
    assert row == SampleRow(0.75, 7, 0.6, -3)


def test_unseeded_rows_draw_keys_from_the_generator():
    """Without a seed the key comes from ``generator`` (reproducible for one generator state)."""
    params = SamplingParams(temperature=1.0)
    a = SampleRow.of(params, torch.Generator().manual_seed(9)).seed
    b = SampleRow.of(params, torch.Generator().manual_seed(9)).seed
    assert a == b and 0 <= a < 2**62
