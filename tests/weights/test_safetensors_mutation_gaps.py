"""Gaps in the tests of ``nonstop.weights.safetensors_file`` found by a mutation audit: data offsets that are
not JSON integers (the safetensors format's offsets are unsigned integers; its reader refuses a float, a
string or a bool), and the copy-on-write map the docstring promises (a tensor view may be written without
touching the file or warning about a read-only buffer)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from nonstop.weights.errors import CheckpointError
from nonstop.weights.safetensors_file import SafetensorsFile


def _file(path, offsets) -> None:
    head = json.dumps({"t": {"dtype": "I32", "shape": [2], "data_offsets": offsets}}).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + struct.pack("<2i", 7, -3))


@pytest.mark.parametrize("offsets", [[0.0, 8.0], [0, 8.0], ["0", "8"], [False, 8], [0, "8"]])
def test_data_offsets_that_are_not_integers_are_a_corrupt_entry(tmp_path, offsets):
    path = tmp_path / "a.safetensors"
    _file(path, offsets)
    with pytest.raises(CheckpointError, match=r"a\.safetensors: corrupt header entry for tensor 't'"):
        SafetensorsFile(path)


def test_integer_offsets_of_the_same_file_read_back(tmp_path):
    path = tmp_path / "a.safetensors"
    _file(path, [0, 8])
    assert SafetensorsFile(path).tensor("t").tolist() == [7, -3]


def test_a_tensor_view_is_copy_on_write(tmp_path):
    """Writing into the returned view works (a read-only map would crash the process on the write) and
    leaves the file as it was. Run in a child process so that such a crash fails the test, not the run."""
    path = tmp_path / "a.safetensors"
    _file(path, [0, 8])
    before = path.read_bytes()
    code = (
        "import sys; from nonstop.weights.safetensors_file import SafetensorsFile\n"
        "t = SafetensorsFile(sys.argv[1]).tensor('t'); t.add_(1); print(t.tolist())"
    )
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[8, -2]", r.stderr[-500:]
    assert path.read_bytes() == before
    assert SafetensorsFile(path).tensor("t").tolist() == [7, -3]
