"""``SampleRow.of`` at the edges its module docstring names: a temperature *below* 1e-30 samples as greedy
(so 1e-30 itself keeps its value), a top_p under float32's smallest normal is raised to it (so the smallest
normal itself is kept), and a top_k of 2**31 - 1 (under the 'beyond any vocabulary' 2**31) is kept."""

from __future__ import annotations

import torch

from nonstop.engine.sampling import SamplingParams
from nonstop.runtime.device_sampling import SampleRow


def test_a_temperature_of_exactly_the_greedy_floor_is_kept():
    # fails on the mutation `temperature < 1e-30` -> `<=` (D8): "below this ... samples as greedy"
    assert SampleRow.of(SamplingParams(temperature=1e-30, seed=1)).temperature == 1e-30
    assert SampleRow.of(SamplingParams(temperature=9.99e-31, seed=1)).temperature == 0.0


def test_top_p_at_float32s_smallest_normal_is_kept_and_below_it_is_raised_to_it():
    tiny = torch.finfo(torch.float32).tiny  # 2**-126
    assert tiny == 2.0**-126
    assert SampleRow.of(SamplingParams(temperature=1.0, top_p=2.0**-126, seed=1)).top_p == 2.0**-126
    assert SampleRow.of(SamplingParams(temperature=1.0, top_p=2.0**-130, seed=1)).top_p == 2.0**-126
    assert SampleRow.of(SamplingParams(temperature=1.0, top_p=2.0**-100, seed=1)).top_p == 2.0**-100


def test_the_largest_int32_top_k_is_kept():
    assert SampleRow.of(SamplingParams(temperature=1.0, top_k=2**31 - 1, seed=1)).top_k == 2**31 - 1
    assert SampleRow.of(SamplingParams(temperature=1.0, top_k=2**31, seed=1)).top_k == -1


def test_unseeded_rows_without_a_generator_get_fresh_keys():
    # fails on the mutation `random.getrandbits(KEY_BITS)` -> `0` (D24): "a fresh random seed per call"
    keys = {SampleRow.of(SamplingParams(temperature=1.0)).seed for _ in range(4)}
    assert len(keys) == 4  # 64-bit random keys: a collision has probability ~2^-61
    assert all(-(2**63) <= k < 2**63 for k in keys)
