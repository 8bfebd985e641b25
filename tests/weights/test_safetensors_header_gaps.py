"""Gaps in the safetensors header checks (``nonstop.weights.safetensors_file``) found by a mutation audit.
Every file here is written byte by byte from the format (8-byte little-endian header length, JSON header,
data; offsets relative to the data), and the expected values and errors come from that definition."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from nonstop.weights.errors import CheckpointError
from nonstop.weights.safetensors_file import SafetensorsFile


def _file(path, header, data: bytes = b"", raw: bytes | None = None):
    head = json.dumps(header).encode() if raw is None else raw
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)
    return path


def _entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


@pytest.mark.parametrize(
    "entry",
    [
        {"shape": [1], "data_offsets": [0, 1]},  # no dtype: a KeyError inside
        {"dtype": "U8", "shape": None, "data_offsets": [0, 1]},  # a TypeError inside
        {"dtype": "U8", "shape": [1.0], "data_offsets": [0, 1]},  # a float dimension
        {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]},  # three offsets
    ],
    ids=["no-dtype", "null-shape", "float-dim", "three-offsets"],
)
def test_a_malformed_entry_is_a_checkpoint_error_naming_the_tensor(tmp_path, entry):
    """Catches a dropped KeyError / TypeError / ValueError from the caught exceptions, or a float dimension
    accepted (it becomes a shape torch cannot view): each must be one CheckpointError naming tensor and file,
    not a traceback."""
    path = _file(tmp_path / "e.safetensors", {"w": entry}, b"\x07")
    with pytest.raises(CheckpointError, match=r"e\.safetensors: corrupt header entry for tensor 'w'"):
        SafetensorsFile(path)


def test_an_unknown_dtype_is_named_with_the_ones_nonstop_reads(tmp_path):
    """Catches the unknown-dtype branch removed (the KeyError fallback says only "corrupt header entry")."""
    path = _file(tmp_path / "d.safetensors", {"w": _entry("F4", [2], 0, 1)}, b"\x00")
    with pytest.raises(CheckpointError, match=r"tensor 'w' has dtype 'F4', which nonstop cannot read \(known: F64"):
        SafetensorsFile(path)


def test_more_bytes_stored_than_the_shape_holds_is_refused(tmp_path):
    """Catches the byte-count check weakened to "too few bytes": 8 bytes stored for a [1] F32 tensor tile
    the data exactly, so only this check stops a tensor torch cannot view as its shape."""
    path = _file(tmp_path / "b.safetensors", {"w": _entry("F32", [1], 0, 8)}, bytes(8))
    with pytest.raises(CheckpointError, match=r"corrupt tensor 'w': 8 bytes stored for shape \[1\] F32"):
        SafetensorsFile(path)


def test_fewer_bytes_stored_than_the_shape_holds_is_refused(tmp_path):
    """Catches the byte-count check weakened to "too many bytes": [2] F32 needs 8 bytes, 4 are stored."""
    path = _file(tmp_path / "s.safetensors", {"w": _entry("F32", [2], 0, 4)}, bytes(4))
    with pytest.raises(CheckpointError, match=r"corrupt tensor 'w': 4 bytes stored for shape \[2\] F32"):
        SafetensorsFile(path)


def test_a_negative_begin_offset_is_a_corrupt_tensor(tmp_path):
    """Catches ``begin < 0`` dropped: offsets [-4, 0] hold the right byte count for [1] F32 but point
    before the data (into the header)."""
    header = {"a": _entry("F32", [1], -4, 0), "b": _entry("F32", [1], 0, 4)}
    path = _file(tmp_path / "n.safetensors", header, bytes(4))
    with pytest.raises(CheckpointError, match=r"corrupt tensor 'a': 4 bytes stored for shape \[1\] F32"):
        SafetensorsFile(path)


def test_only_a_negative_dimension_is_refused_not_every_dimension(tmp_path):
    """Catches ``any`` turned into ``all`` (a [2, -1] shape let through) in the negative-shape check."""
    path = _file(tmp_path / "g.safetensors", {"w": _entry("U8", [2, -1], 0, 0)})
    with pytest.raises(CheckpointError, match=r"tensor 'w': negative shape \[2, -1\]"):
        SafetensorsFile(path)


def test_metadata_offsets_out_of_order_and_empty_tensors_read_back(tmp_path):
    """A valid file the checks must accept: ``__metadata__`` (not a tensor), tensors listed out of offset
    order, an empty tensor between two others. Catches the metadata not skipped, the spans checked
    unsorted, and the empty-tensor shortcut dropped (torch.frombuffer refuses a zero count)."""
    header = {
        "__metadata__": {"format": "pt"},
        "z": _entry("I32", [2], 2, 10),
        "e": _entry("F32", [0, 3], 2, 2),
        "a": _entry("I8", [2], 0, 2),
    }
    f = SafetensorsFile(_file(tmp_path / "ok.safetensors", header, bytes([0xFF, 0x80]) + struct.pack("<2i", 7, -9)))
    assert sorted(f.names()) == ["a", "e", "z"]
    assert f.tensor("a").tolist() == [-1, -128]  # I8: 0xFF is -1, 0x80 is -128 (U8 would be 255, 128)
    assert f.tensor("z").tolist() == [7, -9]
    e = f.tensor("e")
    assert e.shape == (0, 3) and e.dtype == torch.float32


def test_a_header_filling_the_whole_file_is_accepted(tmp_path):
    """Header length == file size - 8 (no data at all, only empty tensors) is a valid file: catches the
    length check tightened to ``>=``."""
    f = SafetensorsFile(_file(tmp_path / "h.safetensors", {"e": _entry("F32", [0], 0, 0)}))
    assert f.data_start == (tmp_path / "h.safetensors").stat().st_size
    assert f.tensor("e").shape == (0,)


def test_a_header_length_past_the_file_is_reported_as_such(tmp_path):
    """A header length between size - 8 and size: catches the bound loosened to the file size (the data
    section would then have a negative size and the error would blame the tensors)."""
    head = json.dumps({}).encode()
    path = tmp_path / "l.safetensors"
    path.write_bytes(struct.pack("<Q", len(head) + 4) + head)
    with pytest.raises(CheckpointError, match=rf"header of {len(head) + 4} bytes in a {len(head) + 8}-byte file"):
        SafetensorsFile(path)


def test_a_seven_byte_file_has_no_header(tmp_path):
    """Catches the "no header" check off by one (7 bytes would be unpacked as a length)."""
    path = tmp_path / "t.safetensors"
    path.write_bytes(b"\x01" * 7)
    with pytest.raises(CheckpointError, match=r"truncated or corrupt safetensors file \(7 bytes, no header\)"):
        SafetensorsFile(path)


@pytest.mark.parametrize(
    "raw", [b'{"\xff": 1}', b"[" * 100_000 + b"]" * 100_000], ids=["not-utf8", "nested-past-recursion"]
)
def test_a_header_that_cannot_be_decoded_is_not_json(tmp_path, raw):
    """Catches UnicodeDecodeError or RecursionError dropped from the JSON errors caught (a traceback)."""
    path = _file(tmp_path / "j.safetensors", None, raw=raw)
    with pytest.raises(CheckpointError, match=r"j\.safetensors: corrupt safetensors header \(not JSON\)"):
        SafetensorsFile(path)


def test_a_tensor_ending_exactly_at_the_end_of_the_data_is_not_truncated(tmp_path):
    """A tensor ending one byte past the data is truncated, one ending at the last byte is not: catches the
    truncation check off by one either way."""
    ok = SafetensorsFile(_file(tmp_path / "ok.safetensors", {"w": _entry("U8", [3], 0, 3)}, b"\x01\x02\x03"))
    assert ok.tensor("w").tolist() == [1, 2, 3]
    with pytest.raises(CheckpointError, match=r"truncated file: tensor 'w' ends at byte 3 of the data but the file"):
        SafetensorsFile(_file(tmp_path / "short.safetensors", {"w": _entry("U8", [3], 0, 3)}, b"\x01\x02"))


@pytest.mark.parametrize(
    "dtype,data,want",
    [
        ("F8_E4M3", bytes([0x38, 0xC0]), [1.0, -2.0]),  # E4M3: 0 0111 000 = 1.0, 1 1000 000 = -2.0
        ("I16", struct.pack("<2h", -2, 300), [-2, 300]),
        ("BF16", bytes([0x80, 0x3F, 0x00, 0xC0]), [1.0, -2.0]),  # bf16 0x3F80 = 1.0, 0xC000 = -2.0
        ("F16", bytes([0x00, 0x3C, 0x00, 0xC0]), [1.0, -2.0]),  # fp16 0x3C00 = 1.0, 0xC000 = -2.0
        ("BOOL", bytes([0, 1]), [False, True]),
    ],
)
def test_each_dtype_string_reads_its_own_bytes(tmp_path, dtype, data, want):
    """Each safetensors dtype string maps to the torch dtype whose bytes it stores (catches a swapped
    entry in the dtype table, e.g. I8 read as U8 or F8_E5M2 as E4M3)."""
    f = SafetensorsFile(_file(tmp_path / "x.safetensors", {"w": _entry(dtype, [2], 0, len(data))}, data))
    got = f.tensor("w")
    assert (got.float() if got.is_floating_point() else got).tolist() == want
