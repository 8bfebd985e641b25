"""Gaps in the tests of ``nonstop.weights.slices.SliceReader`` (a rank's positioned reads): a file cut short
after its header was checked, a whole tensor read without naming a dimension, and byte counts of uneven
column splits. Expected values are the row-major element order written into the file."""

from __future__ import annotations

import json
import struct

import pytest

from nonstop.weights.errors import CheckpointError
from nonstop.weights.safetensors_file import SafetensorsFile
from nonstop.weights.slices import SliceReader


def _int32_file(path, shape, values):
    head = json.dumps({"t": {"dtype": "I32", "shape": list(shape), "data_offsets": [0, 4 * len(values)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + struct.pack(f"<{len(values)}i", *values))
    return SafetensorsFile(path)


def test_a_file_cut_short_after_opening_is_a_checkpoint_error(tmp_path):
    """The header was valid when opened; the file then lost its last bytes (a download still being written,
    a disk filling up). Catches the short-read check dropped (a bare torch view error instead)."""
    path = tmp_path / "cut.safetensors"
    f = _int32_file(path, (3, 4), list(range(12)))
    path.write_bytes(path.read_bytes()[:-8])
    r = SliceReader()
    try:
        with pytest.raises(CheckpointError, match=r"cut\.safetensors: truncated file \(wanted 48 bytes at offset"):
            r.read(f, "t")
        with pytest.raises(CheckpointError, match=r"truncated file \(wanted 8 bytes"):
            r.read(f, "t", dim=1, start=2, stop=4)  # the last row's run is past the new end
    finally:
        r.close()


def test_the_whole_tensor_without_a_dimension_and_uneven_column_splits(tmp_path):
    """``read(f, name)`` is every element; a 10-column matrix split 4 / 3 / 3 (an uneven tensor-parallel cut)
    gives each rank exactly its columns and reads exactly their bytes."""
    values = list(range(30))  # [3, 10]: row r holds 10r .. 10r + 9
    f = _int32_file(tmp_path / "m.safetensors", (3, 10), values)
    r = SliceReader()
    try:
        assert r.read(f, "t").flatten().tolist() == values and r.bytes_read == 120
        parts = [(0, 4), (4, 7), (7, 10)]
        for a, b in parts:
            before = r.bytes_read
            got = r.read(f, "t", dim=1, start=a, stop=b)
            assert got.tolist() == [[10 * row + c for c in range(a, b)] for row in range(3)]
            assert r.bytes_read - before == 3 * (b - a) * 4
        # all columns of a 3-D view, middle dim: one contiguous read of everything
        before = r.bytes_read
        whole = r.read(f, "t", shape=(3, 5, 2), dim=1, start=0, stop=5)
        assert whole.flatten().tolist() == values and r.bytes_read - before == 120
    finally:
        r.close()
