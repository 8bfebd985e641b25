"""Host-side launch logic of the kernels (``nonstop/kernels``): KV split sizing, GEMV launch guards and
rounding, each checked against hand arithmetic or plain torch written here."""

from __future__ import annotations

import pytest
import torch

from nonstop.kernels import attn_tiles, gemv
from nonstop.kernels.platform import H100, simulating


def test_choose_split_fills_the_interpreters_two_sms_with_two_programs_each():
    """Catches a split count that ignores ``programs_per_sm``: 2 SMs x 2 programs / 3 programs a split
    -> ceil(4/3) = 2 splits of 16384 keys (not one split of 32768)."""
    assert attn_tiles.choose_split(32768, 3, 32, "cpu", min_split=256) == (16384, 2)


def test_choose_split_on_an_h100_rounds_up_at_every_step():
    """Catches floor division where the split length or count must round up: 132 SMs / 3 programs a
    split -> 44 splits; ceil(32768 / 44) = 745 keys, rounded up to the 16-key tile = 752; ceil(32768 / 752)
    = 44 splits (floors would give 744 keys, or 736 keys and 45 splits, or 43 splits missing keys)."""
    with simulating(H100):
        split, ns = attn_tiles.choose_split(32768, 3, 16, None, min_split=128, programs_per_sm=1)
    assert (split, ns) == (752, 44)
    assert split * ns >= 32768 and split * (ns - 1) < 32768


def test_choose_split_keeps_splits_at_least_min_split_long():
    """Catches a minimum split length taken from the key tile (or a floor of 2 splits): 300 keys with
    min_split 256 give one split (300 // 256 = 1) of 304 keys (300 rounded up to 16), not two of 160."""
    assert attn_tiles.choose_split(300, 3, 16, "cpu", min_split=256) == (304, 1)


def test_choose_split_of_an_empty_context():
    """Catches dropping the clamp of an empty context to one key: a table with no key columns still gets
    one split of one key tile, not a zero split length (ZeroDivisionError)."""
    assert attn_tiles.choose_split(0, 3, 16, "cpu") == (16, 1)


def test_launch_gemv_refuses_an_input_with_a_column_stride():
    """Catches dropping the unit-column-stride guard on x: the kernel indexes x's columns as contiguous, so a
    transposed input must be refused, not multiplied as garbage."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(40, 3, generator=gen).T  # [3, 40], column stride 3
    w = torch.randn(20, 40, generator=gen)
    out = torch.zeros(3, 20)
    with pytest.raises(ValueError, match="unit column strides"):
        gemv.launch_gemv(x, w, out, epilogue=gemv.STORE)


@pytest.mark.parametrize(
    "w_shape, out_shape, bias_n, norm_k",
    [((20, 32), (3, 20), None, None), ((20, 40), (3, 10), None, None), ((20, 40), (3, 20), 19, None)]
    + [((20, 40), (3, 20), None, 32), ((20, 40), (2, 20), None, None)],
)
def test_launch_gemv_refuses_operands_that_do_not_fit(w_shape, out_shape, bias_n, norm_k):
    """x [3, 40] against a w of 32 columns (the kernel read 40 of them: into the next row), an out of 10
    columns for 20 outputs (written past its end), a bias or norm of the wrong length, an out of 2 rows:
    each refused with a ValueError, and nothing written to a NaN-poisoned out."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 40, generator=gen)
    w = torch.randn(*w_shape, generator=gen)
    backing = torch.full((out_shape[0], 30), float("nan"))
    out = backing[:, : out_shape[1]]
    bias = None if bias_n is None else torch.randn(bias_n, generator=gen)
    norm = None if norm_k is None else torch.rand(norm_k, generator=gen)
    with pytest.raises(ValueError, match="gemv needs"):
        gemv.launch_gemv(x, w, out, bias=bias, norm=norm, epilogue=gemv.STORE)
    assert backing.isnan().all()


@pytest.mark.parametrize("epilogue", ["store", "add"])
def test_launch_gemv_rounds_y_to_the_weight_dtype(epilogue):
    """Catches ``round_y`` not reaching the kernel: fp16 weights, fp32 output; with round_y each y must be
    an fp16 value (what ``F.linear`` in fp16 returns) before it is stored or added to a zero output."""
    gen = torch.Generator().manual_seed(11)
    R, N, K = 3, 37, 45
    x = torch.randn(R, K, generator=gen).half()
    w = torch.randn(N, K, generator=gen).half()
    out = torch.zeros(R, N) if epilogue == "add" else torch.full((R, N), float("nan"))
    mode = gemv.ADD if epilogue == "add" else gemv.STORE
    gemv.launch_gemv(x, w, out, epilogue=mode, round_y=True)
    want = (x.float() @ w.float().T).half().float()  # fp32 sum, one rounding to fp16
    torch.testing.assert_close(out, want, rtol=2e-3, atol=2e-3)
    assert torch.equal(out.half().float(), out), "y was not rounded to fp16 before the fp32 store"


def test_choose_split_divides_the_keys_rounding_up():
    """Catches a floor where the keys are shared among the splits: 33 keys in 2 splits (33 // 16 = 2, the
    interpreter wants ceil(4 / 3) = 2) of ceil(33 / 2) = 17 keys at a 1-key tile, not 16 keys and 3 splits."""
    assert attn_tiles.choose_split(33, 3, 1, "cpu", min_split=16) == (17, 2)
