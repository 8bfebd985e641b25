"""Gaps found by a mutation audit of the weight decoders and readers. Expected values are written out by hand
from the format definitions (OCP MXFP4: E2M1 codes, E8M0 scales 2^(s-127) with 0xFF NaN; safetensors)."""

from __future__ import annotations

import math

import pytest
import torch

from nonstop.weights import mxfp4
from nonstop.weights.errors import CheckpointError
from nonstop.weights.loader import check_mxfp4_scale


def test_mxfp4_e8m0_byte_255_is_nan_and_254_is_two_to_the_127():
    # code 2 (E2M1 1.0) in the low nibble, code 1 (0.5) in the high nibble of each byte
    packed = torch.tensor([[0x12] * 16, [0x12] * 16], dtype=torch.uint8)
    scale = torch.tensor([[254], [255]], dtype=torch.uint8)
    w = mxfp4.dequantize(packed, scale, 32)
    assert w[0, 0].item() == 2.0**127
    assert w[0, 1].item() == 2.0**126
    assert torch.isnan(w[1]).all()


@pytest.mark.parametrize("k,packed_cols,scale_cols", [(37, 19, 2), (64, 32, 2), (1, 1, 1), (33, 17, 2)])
def test_mxfp4_shapes_round_a_ragged_row_up(k, packed_cols, scale_cols):
    assert mxfp4.packed_shape(3, k) == (3, packed_cols)
    assert mxfp4.scale_shape(3, k) == (3, scale_cols)


def test_mxfp4_scale_error_calls_255_nan_and_only_255():
    with pytest.raises(CheckpointError, match=r"the largest 255 \(NaN in E8M0\)"):
        check_mxfp4_scale("s", torch.tensor([3, 255, 250], dtype=torch.uint8), "f.safetensors")
    with pytest.raises(CheckpointError) as info:
        check_mxfp4_scale("s", torch.tensor([254], dtype=torch.uint8), "f.safetensors")
    assert "NaN" not in str(info.value)
    check_mxfp4_scale("s", torch.tensor([0, 127, 240], dtype=torch.uint8), "f.safetensors")  # no error


def test_mxfp4_odd_k_decodes_the_last_low_nibble():
    # k = 3: bytes (lo, hi) = (code 7 = 6.0, code 9 = -0.5), (code 12 = -2.0, pad); scale 128 -> x2
    packed = torch.tensor([[0x97, 0x0C]], dtype=torch.uint8)
    w = mxfp4.dequantize(packed, torch.tensor([[128]], dtype=torch.uint8), 3)
    assert w.tolist() == [[12.0, -1.0, -4.0]]
    assert math.isclose(float(w.abs().sum()), 17.0)


def test_int8_groups_by_hand_and_an_all_zero_group_keeps_scale_one():
    from nonstop.weights.quant import dequantize_int8, quantize_int8

    w = torch.tensor([[1.0, -2.0, 0.5, 4.0], [0.0, 0.0, 3.0, -1.5]])
    q, s = quantize_int8(w, 2)
    # s = max |group| / 127 (1 for an all-zero group); q = round(w / s), ties to even (63.5 -> 64)
    torch.testing.assert_close(s, torch.tensor([[2 / 127, 4 / 127], [1.0, 3 / 127]]))
    assert q.tolist() == [[64, -127, 16, 127], [0, 0, 127, -64]]
    assert torch.isfinite(dequantize_int8(q, s)).all()
    assert dequantize_int8(q, s)[1, :2].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("group", [0, -2])
def test_int8_refuses_a_group_size_that_is_not_positive(group):
    from nonstop.weights.quant import quantize_int8

    with pytest.raises(ValueError, match="does not divide"):
        quantize_int8(torch.ones(2, 4), group)


def test_fp8_scale_that_overflows_by_less_than_twice_is_named_as_the_scale():
    from pathlib import Path
    from types import SimpleNamespace

    from nonstop.weights.loader import check_fp8_dequantized

    # 448 (e4m3 max) x 1e36 = 4.48e38 > float32 max 3.40e38: the scale is what is corrupt
    w = torch.full((2, 2), 448.0).to(torch.float8_e4m3fn)
    scale = torch.tensor([[1e36]])
    out = w.float() * 1e36
    assert torch.isinf(out).all()
    located = {"m.w_scale_inv": SimpleNamespace(path=Path("/x/m.safetensors"))}
    with pytest.raises(CheckpointError, match=r"'m.w_scale_inv' in m.safetensors holds scales up to 1e\+36"):
        check_fp8_dequantized("m.w", w, "m.w_scale_inv", scale, out, located)
    fine = torch.full((2, 2), 1.0).to(torch.float8_e4m3fn)
    assert check_fp8_dequantized("m.w", fine, "m.w_scale_inv", scale, fine.float() * 1e36, located) is not None


def _raw_safetensors(path, header: dict, data: bytes):
    import json
    import struct

    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)
    return path


def test_safetensors_f8_e5m2_reads_as_e5m2(tmp_path):
    from nonstop.weights.safetensors_file import SafetensorsFile

    # E5M2 byte 0x3C = 0 01111 00 = 1.0; 0xC0 = 1 10000 00 = -2.0 (E4M3 would read 0x3C as 1.5)
    f = SafetensorsFile(
        _raw_safetensors(
            tmp_path / "a.safetensors",
            {"t": {"dtype": "F8_E5M2", "shape": [2], "data_offsets": [0, 2]}},
            bytes([0x3C, 0xC0]),
        )
    )
    assert f.meta("t")[0] == torch.float8_e5m2
    assert f.tensor("t").float().tolist() == [1.0, -2.0]


@pytest.mark.parametrize(
    "header,data,match",
    [
        ({"t": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}, b"\x01", "corrupt header entry"),
        (  # two tensors sharing byte 1
            {
                "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]},
            },
            b"\x01\x02\x03",
            "overlaps 'a'",
        ),
        ({"t": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"\x01\x02\x03", "the tensors end at byte 2"),
        ({"t": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, b"\x01\x02", "truncated file"),
    ],
    ids=["bool-dim", "overlap", "trailing-bytes", "truncated"],
)
def test_safetensors_header_checks(tmp_path, header, data, match):
    from nonstop.weights.safetensors_file import SafetensorsFile

    with pytest.raises(CheckpointError, match=match):
        SafetensorsFile(_raw_safetensors(tmp_path / "b.safetensors", header, data))


def test_slice_reader_columns_rows_and_bytes(tmp_path):
    import struct

    from nonstop.weights.safetensors_file import SafetensorsFile
    from nonstop.weights.slices import SliceReader

    data = struct.pack("<12i", *range(12))  # [[0..3], [4..7], [8..11]] int32
    f = SafetensorsFile(
        _raw_safetensors(
            tmp_path / "c.safetensors", {"t": {"dtype": "I32", "shape": [3, 4], "data_offsets": [0, 48]}}, data
        )
    )
    r = SliceReader()
    try:
        assert r.read(f, "t", dim=1, start=1, stop=3).tolist() == [[1, 2], [5, 6], [9, 10]]
        assert r.bytes_read == 3 * 2 * 4
        assert r.read(f, "t", dim=0, start=1, stop=3).tolist() == [[4, 5, 6, 7], [8, 9, 10, 11]]
        assert r.read(f, "t", shape=(2, 6), dim=0).tolist() == [list(range(6)), list(range(6, 12))]
        assert r.read(f, "t", shape=(12,), dim=0, start=10).tolist() == [10, 11]
        assert r.read(f, "t", dim=1, start=0, stop=4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
        # [2, 3, 2] view, middle dim [1, 3): rows 2..5 of each half
        assert r.read(f, "t", shape=(2, 3, 2), dim=1, start=1, stop=3).tolist() == [
            [[2, 3], [4, 5]],
            [[8, 9], [10, 11]],
        ]
    finally:
        r.close()


@pytest.mark.parametrize("device,want", [("cuda", torch.bfloat16), ("cuda:1", torch.bfloat16), ("cpu", torch.float32)])
def test_auto_dtype_is_bf16_on_cuda_and_fp32_on_cpu(device, want):
    from nonstop.weights.resolve import parse_dtype

    assert parse_dtype("auto", device) is want
    assert parse_dtype(None, device) is want
