"""``launch_gemv``'s operand checks and ``gemv.tf32_round`` (``nonstop/kernels/gemv.py``) where the existing
tests do not reach: a weight with a column stride and a 17-row input must be refused with a ValueError (the
kernel reads w by a unit column stride and holds at most 16 rows: either would be computed wrong silently),
and the tf32 rounding is round-to-nearest at the 10th mantissa bit, ties away from zero (``cvt.rna.tf32.f32``),
checked on hand-picked fp32 values."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from nonstop.kernels.gemv import STORE, launch_gemv, tf32_round


def test_launch_gemv_refuses_a_weight_with_a_column_stride():
    """w = a transposed [K, N] tensor (stride (1, N)): the kernel would read it as row-major; refused."""
    x, w = torch.randn(2, 8), torch.randn(8, 5).t()
    with pytest.raises(ValueError, match="unit column strides"):
        launch_gemv(x, w, torch.empty(2, 5), epilogue=STORE)


def test_launch_gemv_refuses_seventeen_rows():
    """R = 17 exceeds the tile's 16 rows: refused, not computed over a partial row block."""
    with pytest.raises(ValueError, match="at most 16 rows"):
        launch_gemv(torch.randn(17, 16), torch.randn(16, 16), torch.empty(17, 16), epilogue=STORE)


@triton.jit
def _tf32_probe(x_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, tf32_round(tl.load(x_ptr + i)))


def test_tf32_round_is_nearest_ties_away_at_the_tenth_mantissa_bit():
    """tf32 keeps 10 mantissa bits (ulp 2^-10 at 1.0): 1 + 2^-11 is a tie -> away from zero 1 + 2^-10;
    1 + 2^-12 rounds down to 1; 1 + 2^-11 + 2^-20 rounds up; negatives mirror; 1 + 2^-10 is exact."""
    cases = [
        (1 + 2**-11, 1 + 2**-10),
        (1 + 2**-12, 1.0),
        (1 + 2**-11 + 2**-20, 1 + 2**-10),
        (-(1 + 2**-11), -(1 + 2**-10)),
        (1 + 2**-10, 1 + 2**-10),
        (3 + 2**-10 - 2**-20, 3.0),
    ]
    x = torch.tensor([c[0] for c in cases] + [0.0] * (8 - len(cases)), dtype=torch.float32)
    out = torch.empty_like(x)
    _tf32_probe[(1,)](x, out, N=8)
    assert out[: len(cases)].tolist() == [c[1] for c in cases]
