"""Checkpoint reading against independent oracles: ``SafetensorsFile`` and ``SliceReader`` against the
``safetensors`` package's own reader (every dtype nonstop reads, every row / column slice), and
``mxfp4.dequantize`` against a decoder written from the OCP MX v1.0 spec (E2M1 from its sign / exponent /
mantissa bits, E8M0 scale 2^(s-127), 255 = NaN, 32-element blocks), not from nonstop's table."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from nonstop.weights import mxfp4
from nonstop.weights.safetensors_file import SafetensorsFile
from nonstop.weights.slices import SliceReader


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "bf16": torch.randn(7, 9, generator=g).to(torch.bfloat16),
        "f16": torch.randn(5, 3, 4, generator=g).half(),
        "e4m3": (torch.randn(6, 10, generator=g) * 50).to(torch.float8_e4m3fn),
        "e5m2": (torch.randn(6, 10, generator=g) * 50).to(torch.float8_e5m2),
        "i64": torch.arange(12).reshape(3, 4) - 5,
        "bool": torch.rand(4, 5, generator=g) > 0.5,
        "u8": torch.randint(0, 256, (3, 33), generator=g, dtype=torch.uint8),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "f64": torch.randn(3, generator=g, dtype=torch.float64),
    }
    path = tmp_path_factory.mktemp("oracle") / "a.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})  # the safetensors package's writer
    return path, load_file(str(path))  # and its reader: the oracle


def test_every_dtype_reads_the_bytes_the_safetensors_package_reads(written):
    path, ref = written
    f = SafetensorsFile(path)
    assert sorted(f.names()) == sorted(ref)
    for name, want in ref.items():
        got = f.tensor(name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert _bytes(got) == _bytes(want), name


def test_every_row_and_column_slice_matches_the_package(written):
    """Each [a, b) of each dim, as a tensor-parallel rank reads it (one run for rows, one per row for columns),
    and ``bytes_read`` counts exactly the elements returned."""
    path, ref = written
    f = SafetensorsFile(path)
    r = SliceReader()
    try:
        for name, want in ref.items():
            before = r.bytes_read
            whole = r.read(f, name)
            assert whole.shape == want.shape and _bytes(whole) == _bytes(want), name
            assert r.bytes_read - before == want.numel() * want.element_size()
            for dim in range(want.dim()):
                for a, b in itertools.combinations(range(want.shape[dim] + 1), 2):
                    before = r.bytes_read
                    got = r.read(f, name, None, dim, a, b)
                    part = want.narrow(dim, a, b - a)
                    assert got.shape == part.shape and _bytes(got) == _bytes(part), (name, dim, a, b)
                    assert r.bytes_read - before == part.numel() * part.element_size()
    finally:
        r.close()


@pytest.mark.parametrize("shape", [(15, 4), (5, 12), (60,), (2, 4), (3, 2, 10)])
def test_slices_of_another_view_of_the_element_order(written, shape):
    """A tensor read as another shape (or a prefix of its elements, as a zero-padded A_log is) slices that
    view of the row-major element order."""
    path, ref = written
    f = SafetensorsFile(path)
    flat = ref["f16"].reshape(-1)[: math.prod(shape)].reshape(shape)
    r = SliceReader()
    try:
        for dim in range(len(shape)):
            for a in range(shape[dim] + 1):
                for b in range(a, shape[dim] + 1):
                    got = r.read(f, "f16", shape, dim, a, b)
                    assert torch.equal(got, flat.narrow(dim, a, b - a)), (shape, dim, a, b)
    finally:
        r.close()


def _e2m1(code: int) -> float:
    """OCP MX E2M1: 1 sign, 2 exponent (bias 1), 1 mantissa bit; exponent 0 is subnormal (m · 0.5)."""
    sign = -1.0 if code & 0b1000 else 1.0
    e, m = (code >> 1) & 0b11, code & 1
    return sign * (m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1))


def _dequant_by_hand(packed: torch.Tensor, scale: torch.Tensor, k: int) -> list[list[float]]:
    rows = []
    for prow, srow in zip(packed.tolist(), scale.tolist()):
        row = []
        for j in range(k):
            code = prow[j // 2] >> 4 if j % 2 else prow[j // 2] & 0xF  # low nibble: the even element
            s = srow[j // 32]
            row.append(_e2m1(code) * (math.nan if s == 255 else 2.0 ** (s - 127)))
        rows.append(row)
    return rows


@pytest.mark.parametrize("k", [1, 2, 31, 32, 33, 64, 65, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp4_dequantize_matches_the_spec_decoder(k, dtype):
    g = torch.Generator().manual_seed(k)
    packed = torch.randint(0, 256, (3, (k + 1) // 2), generator=g, dtype=torch.uint8)
    scale = torch.randint(0, 256, (3, (k + 31) // 32), generator=g, dtype=torch.uint8)
    scale[0, 0], scale[-1, -1] = 0, 255  # the smallest factor 2^-127 and the NaN byte
    want = torch.tensor(_dequant_by_hand(packed, scale, k), dtype=torch.float64)
    got = mxfp4.dequantize(packed, scale, k, dtype)
    assert got.dtype == dtype and got.shape == (3, k)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=0, equal_nan=True)
    stacked = mxfp4.dequantize(torch.stack([packed, packed]), torch.stack([scale, scale]), k, dtype)  # [E, N, K]
    torch.testing.assert_close(stacked[1].double(), want, rtol=0, atol=0, equal_nan=True)


def test_mxfp4_shapes_are_the_spec_block_counts():
    for k in [1, 2, 31, 32, 33, 64, 65]:
        assert mxfp4.packed_shape(5, k) == (5, -(-k // 2))
        assert mxfp4.scale_shape(5, k) == (5, -(-k // 32))


def test_mxfp4_quantize_rounds_ties_to_the_even_code():
    """Midpoints between neighbouring E2M1 magnitudes round to the one whose mantissa bit is 0 (IEEE
    roundTiesToEven, as the OCP MX spec converts); a group holding 6 has scale 2^0, so values are exact."""
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]  # even mantissa: 0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0
    row = torch.tensor([6.0] + ties + [-t for t in ties] + [0.4, 0.6, 5.5])
    packed, scale = mxfp4.quantize(row[None])
    assert scale.tolist() == [[127]]
    got = mxfp4.dequantize(packed, scale, row.numel())[0].tolist()
    assert got == [6.0] + want + [-w for w in want] + [0.5, 0.5, 6.0]
