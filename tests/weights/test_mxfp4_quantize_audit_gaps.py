"""Gap found by a mutation audit of ``nonstop/weights/mxfp4.quantize``: an odd K (the last packed byte
holds one code and a zero high nibble). Expected values are E2M1 magnitudes written by hand (OCP MX v1.0:
{0, 0.5, 1, 1.5, 2, 3, 4, 6}, two codes per byte, the even element in the low nibble)."""

from __future__ import annotations

import pytest
import torch

from nonstop.weights import mxfp4

MAGS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.mark.parametrize("k", [1, 3, 33, 65])
def test_an_odd_k_packs_to_half_bytes_rounded_up_and_decodes_back_exactly(k):
    """Values already on the E2M1 grid with amax 6 (scale byte 127) survive quantisation exactly; the last
    byte of each row carries the final code in its low nibble and zero above it."""
    vals = [(-1) ** (i // 8) * MAGS[i % 8] for i in range(k)]
    vals[0] = 6.0  # amax 6 in the first group -> scale 2^0
    w = torch.tensor([vals, [-v for v in vals]])
    packed, scale = mxfp4.quantize(w)
    assert packed.shape == (2, (k + 1) // 2) and scale.shape == (2, (k + 31) // 32)
    assert scale[:, 0].tolist() == [127, 127]
    assert packed[0, -1].item() >> 4 == 0  # the padding nibble of the odd element
    low = packed[0, -1].item() & 0xF
    last = vals[-1]
    assert low == MAGS.index(abs(last)) + (8 if last < 0 else 0) or (last == 0 and low in (0, 8))
    torch.testing.assert_close(mxfp4.dequantize(packed, scale, k), w, rtol=0, atol=0)
