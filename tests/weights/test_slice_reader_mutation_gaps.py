"""Gaps in the tests of ``nonstop.weights.slices.SliceReader`` found by a mutation audit: a 0-d tensor has no
dimension, not even dim 0 (it is read internally as one element of shape [1], which must not leak out as a
sliceable dimension)."""

from __future__ import annotations

import json
import struct

import pytest

from nonstop.weights.safetensors_file import SafetensorsFile
from nonstop.weights.slices import SliceReader


def test_a_0d_tensor_refuses_dim_0(tmp_path):
    path = tmp_path / "s.safetensors"
    head = json.dumps({"s": {"dtype": "I32", "shape": [], "data_offsets": [0, 4]}}).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + struct.pack("<i", 41))
    f, r = SafetensorsFile(path), SliceReader()
    try:
        for dim in (0, 1):
            with pytest.raises(ValueError, match=f"a 0-d tensor has no dim {dim}"):
                r.read(f, "s", dim=dim, start=0, stop=1)
        t = r.read(f, "s")
        assert t.shape == () and t.item() == 41
        assert r.bytes_read == 4
    finally:
        r.close()
