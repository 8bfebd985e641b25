"""The shape-only "fake" versions of the C++ CPU kernels (``runtime/cpu/kernels._register_fakes``): a compiled
step traces the operators through them, so each must give the shape and dtype the real kernel returns. The
expected values are the real kernels' own outputs on the same inputs (plus the documented [rows, n] /
[B, H, Dv]), chosen so that every wrong dimension (K for n, D for Dv, H for B) shows."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from nonstop.runtime.cpu.kernels import load_kernels
from nonstop.runtime.cpu.packed import tile_rows

KERNELS_MISSING = load_kernels(progress=False)
pytestmark = pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")


def _real_and_fake(op, *args):
    """(real output, fake output) of ``op`` on ``args`` (tensors converted to fake tensors for the second)."""
    real = op(*args)
    mode = FakeTensorMode()
    fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    with mode:
        fake = op(*fake_args)
    return real, fake


@pytest.mark.parametrize("kind", ["f32", "bf16"])
def test_the_float_gemv_fakes_give_rows_by_n(kind):
    """A fake returning [rows, K] (the input's width) or [rows, tile rows] would make a compiled step trace the
    wrong shape: 3 rows of K = 37 against n = 7 output rows (tiles padded to 8 x 48 / 8 x 64)."""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(7, 37, generator=g), torch.randn(3, 37, generator=g)
    if kind == "f32":
        real, fake = _real_and_fake(torch.ops.nonstop_cpu.linear_f32, x, tile_rows(w, 16), 7)
    else:
        real, fake = _real_and_fake(torch.ops.nonstop_cpu.linear_bf16, x, tile_rows(w.bfloat16(), 32), 7)
    assert tuple(real.shape) == (3, 7)
    assert tuple(fake.shape) == (3, 7) and fake.dtype == real.dtype


def test_the_int8_gemv_fake_gives_rows_by_n():
    """linear_int8's fake: [rows, n], not [rows, K]."""
    q = tile_rows(torch.randint(-127, 128, (5, 32), dtype=torch.int8), 16)  # 2 chunks of 16 columns
    s = torch.rand(8, 1) + 0.5  # one scale group per row
    x = torch.randn(2, 32)
    real, fake = _real_and_fake(torch.ops.nonstop_cpu.linear_int8, x, q, s, 5)
    assert tuple(real.shape) == (2, 5)
    assert tuple(fake.shape) == (2, 5) and fake.dtype == real.dtype


def test_the_attention_fake_gives_batch_heads_value_width():
    """decode_attention's fake: [B, H, Dv] with Dv the values' width (MLA: differs from the keys' D) and B, H
    in that order (B = 2 queries of H = 4 heads over 2 KV heads, D = 8, Dv = 6)."""
    g = torch.Generator().manual_seed(1)
    B, H, Hkv, D, Dv, P, L = 2, 4, 2, 8, 6, 5, 3
    q = torch.randn(B, H, D, generator=g)
    k, v = torch.randn(P, Hkv, D, generator=g), torch.randn(P, Hkv, Dv, generator=g)
    rows = torch.tensor([[0, 1, 2], [3, 4, 0]])
    visible = torch.tensor([3, 2])
    real, fake = _real_and_fake(torch.ops.nonstop_cpu.decode_attention, q, k, v, rows, visible, 0.5)
    assert tuple(real.shape) == (B, H, Dv) and L == rows.shape[1]
    assert tuple(fake.shape) == (B, H, Dv) and fake.dtype == real.dtype
