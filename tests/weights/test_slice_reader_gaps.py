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


def test_a_0d_tensor_is_read_as_its_one_element(tmp_path):
    """A scalar tensor (shape []) failed with an IndexError on ``shape[0]``; it reads as a 0-d tensor."""
    f = _int32_file(tmp_path / "s.safetensors", (), [-7])
    r = SliceReader()
    try:
        t = r.read(f, "t")
        assert t.shape == () and int(t) == -7 and r.bytes_read == 4
    finally:
        r.close()


def test_a_slice_outside_the_tensor_or_a_larger_view_is_refused(tmp_path):
    """Bounds were not checked: a stop past the dimension read the next tensor's bytes (or raised a bare
    torch view error), a start after the stop gave an empty tensor, and a view larger than the tensor read
    past its end. Each is now a ValueError naming the tensor."""
    f = _int32_file(tmp_path / "b.safetensors", (3, 4), list(range(12)))
    r = SliceReader()
    try:
        assert r.read(f, "t", dim=1, start=1, stop=3).tolist() == [[1, 2], [5, 6], [9, 10]]
        assert r.read(f, "t", (12,), 0, 10, 12).tolist() == [10, 11]
        assert r.read(f, "t", (2, 4)).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]  # a prefix view is allowed
        for dim, start, stop in ((1, 2, 5), (0, 2, 1), (0, -1, 2)):
            with pytest.raises(ValueError, match=r"^t: \[.*\) is not within dim"):
                r.read(f, "t", None, dim, start, stop)
        with pytest.raises(ValueError, match=r"cannot view \[3, 4\] as the larger \[4, 4\]"):
            r.read(f, "t", (4, 4))
    finally:
        r.close()
