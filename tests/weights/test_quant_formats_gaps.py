"""Gaps in the tests of the MXFP4 encoder (``nonstop.weights.mxfp4.quantize``) and the int8 group choice
(``nonstop.weights.quant.group_size``). Expected bytes are worked out by hand from the OCP MX definitions:
E2M1 magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, E8M0 scale byte s = exponent + 127, 32 values per scale."""

from __future__ import annotations

import pytest
import torch

from nonstop.weights import mxfp4
from nonstop.weights.quant import group_size


def test_an_all_zero_group_gets_scale_byte_zero_not_nan():
    """Catches the exponent floor lowered below -127 (byte -128 + 127 wraps to 255, the E8M0 NaN)."""
    packed, scale = mxfp4.quantize(torch.zeros(2, 64))
    assert scale.tolist() == [[0, 0], [0, 0]] and packed.eq(0).all()
    assert mxfp4.dequantize(packed, scale, 64).eq(0).all()


@pytest.mark.parametrize(
    "amax, byte",
    [
        (6.0, 127),  # 6 / 2^0 = 6 <= 6                       -> 2^0
        (5.0, 127),  # 5 / 2^0 <= 6, 5 / 2^-1 = 10 > 6          -> 2^0
        (7.0, 128),  # 7 / 2^0 > 6, 7 / 2^1 = 3.5 <= 6          -> 2^1
        (13.0, 129),  # 13 / 2 = 6.5 > 6, 13 / 4 = 3.25 <= 6    -> 2^2
        (0.75, 124),  # 0.75 / 2^-3 = 6 <= 6, / 2^-4 = 12 > 6   -> 2^-3
    ],
)
def test_the_scale_is_the_smallest_power_of_two_that_fits_six(amax, byte):
    """Per group the scale is the smallest 2^e with amax / 2^e <= 6 (the largest E2M1 magnitude), stored as
    e + 127: catches the bound taken as 4, or the exponent rounded down (amax / scale up to 12, saturated)."""
    w = torch.zeros(1, 32)
    w[0, 3] = -amax  # the sign does not matter
    _, scale = mxfp4.quantize(w)
    assert scale.tolist() == [[byte]]


def test_codes_are_the_nearest_magnitude_with_the_sign_bit():
    """Group of 32 with amax 6 (scale 2^0): each value encodes to its nearest E2M1 magnitude, bit 3 the sign,
    the even element in the low nibble."""
    w = torch.zeros(1, 32)
    w[0, :6] = torch.tensor([6.0, -0.4, 2.9, -1.6, 0.2, 3.9])
    packed, scale = mxfp4.quantize(w)
    # nearest: 6 -> 7 (6.0); -0.4 -> 8|1 (-0.5); 2.9 -> 5 (3.0); -1.6 -> 8|3 (-1.5); 0.2 -> 0; 3.9 -> 6 (4.0)
    assert scale.tolist() == [[127]]
    assert packed[0, :3].tolist() == [0x97, 0xB5, 0x60]


@pytest.mark.parametrize(
    "k, preferred, want",
    [(256, 128, 128), (192, 128, 192), (128, 128, 128), (64, 0, 64), (96, 32, 32), (100, -4, 100)],
)
def test_int8_group_is_the_preferred_size_only_when_it_divides(k, preferred, want):
    """``preferred`` when 0 < preferred < K divides K, else K (one scale per output channel): catches the
    divisibility test dropped (192 columns in groups of 128) and a zero preferred size let through."""
    assert group_size(k, preferred) == want
