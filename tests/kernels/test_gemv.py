"""The GEMV tile every family uses (``nonstop/kernels/gemv.py``) against torch: gathered weight rows, the
gate/up pair, the fused RMSNorm, one row and several (both the tensor-core path), dense and MXFP4 weights
(ragged K included), several K steps; and MXFP4 decoding of every byte and scale exponent."""

from __future__ import annotations

import pytest
import torch

from nonstop.kernels.gemv import STORE, launch_gemv
from nonstop.model.norms import rms_norm
from nonstop.weights import mxfp4
from tests.kernels.probes import gemv, mxfp4_values

F32, F16 = torch.float32, torch.float16


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("R", [1, 5])
@pytest.mark.parametrize("has_norm", [True, False])
def test_dense_rows_pair_and_norm(dtype, R, has_norm):
    gen = torch.Generator().manual_seed(R + 2 * has_norm)
    K = 100
    x = (torch.randn(R, K, generator=gen) * 3).to(dtype)
    norm = (1 + 0.1 * torch.randn(K, generator=gen)).to(dtype)
    wa, wb = (torch.randn(20, K, generator=gen).to(dtype) for _ in range(2))
    rows, rows_b = torch.tensor([19, 0, 4, 4, 11, 2, 7]), torch.tensor([3, 3, 18, 0, 1, 9, 5])
    got_a, got_b = gemv(x, wa, rows, wb=wb, rows_b=rows_b, norm=norm if has_norm else None)
    xin = (rms_norm(x, norm, 1e-5) if has_norm else x).float()
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == F32 else dict(rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(got_a, xin @ wa[rows].float().T, **tol)
    torch.testing.assert_close(got_b, xin @ wb[rows_b].float().T, **tol)


@pytest.mark.parametrize("has_norm", [True, False])
def test_launch_gemv_follows_row_strides(has_norm):
    """x and out are column slices of wider tensors (row strides 70 and 50, not K = 45 and N = 37): every
    row's input, RMS factor and output must use its tensor's stride."""
    gen = torch.Generator().manual_seed(7 + has_norm)
    R, N, K = 5, 37, 45
    x = torch.randn(R, 70, generator=gen)[:, :K]
    w, norm = torch.randn(N, K, generator=gen), 1 + 0.1 * torch.randn(K, generator=gen)
    out = torch.full((R, 50), float("nan"))
    launch_gemv(x, w, out[:, :N], norm=norm if has_norm else None, eps=1e-5, epilogue=STORE, BLOCK_K=16, BLOCK_N=16)
    xin = rms_norm(x, norm, 1e-5) if has_norm else x
    torch.testing.assert_close(out[:, :N], xin @ w.T, rtol=1e-5, atol=1e-4)
    assert out[:, N:].isnan().all(), "columns past N of a wider output were written"


@pytest.mark.parametrize("K", [64, 22, 96])
@pytest.mark.parametrize("R", [1, 3])
def test_mxfp4_rows_match_the_dequantised_weight(K, R):
    """Packed rows (random codes, scales 2^-12 .. 2^3) against ``weights/mxfp4.dequantize``; 32-element
    steps, so K = 64 and 96 take several steps and 22 is one ragged step (11 bytes a row)."""
    gen = torch.Generator().manual_seed(K + R)
    n = 12
    packed = torch.randint(0, 256, mxfp4.packed_shape(n, K), generator=gen, dtype=torch.uint8)
    if K % 2:
        packed[:, -1] &= 0x0F
    scale = torch.randint(115, 130, mxfp4.scale_shape(n, K), generator=gen, dtype=torch.uint8)
    x = torch.randn(R, K, generator=gen)
    rows = torch.tensor([11, 0, 5, 5, 2])
    got, _ = gemv(x, packed, rows, scales=scale, block_k=32)
    want = x @ mxfp4.dequantize(packed, scale, K, torch.float32)[rows].T
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("R", [1, 3])
@pytest.mark.parametrize("K", [512, 480])
def test_mxfp4_steps_and_scale_rows(R, K):
    """MXFP4 rows against the dequantised weight, steps of 32 to 256 elements (several scale groups a step),
    with and without the fused RMSNorm. K = 480: 15 scales a row, stored in rows of 16 whose last is NaN
    (E8M0 255): past the row's end, no value may use it."""
    gen = torch.Generator().manual_seed(40 + R + K)
    n = 9
    packed = torch.randint(0, 256, mxfp4.packed_shape(n, K), generator=gen, dtype=torch.uint8)
    groups = mxfp4.scale_shape(n, K)[1]
    storage = torch.full((n, 16), 255, dtype=torch.uint8)
    storage[:, :groups] = torch.randint(110, 135, (n, groups), generator=gen, dtype=torch.uint8)
    scale = storage[:, :groups]
    x = torch.randn(R, K, generator=gen)
    g = torch.rand(K, generator=gen) + 0.5
    rows = torch.tensor([8, 1, 4, 0, 7])
    w = mxfp4.dequantize(packed, scale.contiguous(), K, torch.float32)[rows]
    for block_k in (32, 128, 256):
        got, _ = gemv(x, packed, rows, scales=scale, block_k=block_k)
        torch.testing.assert_close(got, x @ w.T, rtol=1e-4, atol=1e-3)  # fp32 sums of 512 products of ~1
    got, _ = gemv(x, packed, rows, scales=scale, norm=g, block_k=128)
    torch.testing.assert_close(got, rms_norm(x, g, 1e-5) @ w.T, rtol=1e-4, atol=1e-3)


def test_mxfp4_pair_shares_the_input():
    gen = torch.Generator().manual_seed(9)
    n, K = 6, 64
    pa, pb = (torch.randint(0, 256, mxfp4.packed_shape(n, K), generator=gen, dtype=torch.uint8) for _ in range(2))
    sa, sb = (torch.randint(118, 126, mxfp4.scale_shape(n, K), generator=gen, dtype=torch.uint8) for _ in range(2))
    x = torch.randn(1, K, generator=gen)
    rows = torch.arange(n)
    a, b = gemv(x, pa, rows, wb=pb, scales=sa, scales_b=sb, block_k=64)
    torch.testing.assert_close(a, x @ mxfp4.dequantize(pa, sa, K, torch.float32).T, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(b, x @ mxfp4.dequantize(pb, sb, K, torch.float32).T, rtol=1e-5, atol=1e-4)


def test_mxfp4_decoder_is_exact_for_every_byte_and_scale():
    """All 256 bytes under scale exponents 0 (2^-127, subnormal fp32), 5 .. 240, and 255 (NaN)."""
    b = torch.arange(256, dtype=torch.uint8).repeat(50)
    s = torch.cat([torch.full((256,), e, dtype=torch.uint8) for e in [0, *range(5, 241, 5), 255]])[: b.numel()]
    got = mxfp4_values(b, s)
    want = mxfp4.dequantize(b.view(-1, 1), s.view(-1, 1), 2, torch.float32).view(-1)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_the_rms_is_written_once():
    """Every kernel's RMSNorm factor comes from ``gemv.rms_factor`` (through ``row_inv_rms`` / ``vec_inv_rms``):
    no other kernel module writes an rsqrt of its own."""
    import re
    from pathlib import Path

    import nonstop.kernels

    folder = Path(nonstop.kernels.__file__).parent
    writers = {p.name: len(re.findall(r"\brsqrt\(", p.read_text())) for p in sorted(folder.rglob("*.py"))}
    assert {name: n for name, n in writers.items() if n} == {"gemv.py": 1}
