"""Limits a corrupt checkpoint could push past: a safetensors header length beyond the format's 100 MB
limit is refused before it is read (a corrupt length in a large shard read gigabytes into memory before
"not JSON"), and a JSON integer past Python's 4300-digit limit - in a safetensors header or in
config.json - is a one-line error naming the file, not a bare ValueError."""

from __future__ import annotations

import struct

import pytest

from nonstop.config import ConfigError, ModelConfig
from nonstop.weights.errors import CheckpointError
from nonstop.weights.safetensors_file import MAX_HEADER_BYTES, SafetensorsFile


def test_a_header_length_beyond_the_format_limit_is_refused_unread(tmp_path):
    path = tmp_path / "big.safetensors"
    n = 150_000_000
    with open(path, "wb") as fh:  # a sparse file: the claimed header lies within it
        fh.write(struct.pack("<Q", n))
        fh.truncate(8 + n + 16)

    with pytest.raises(CheckpointError, match=rf"header of {n} bytes; safetensors allows at most {MAX_HEADER_BYTES}"):
        SafetensorsFile(path)
    assert MAX_HEADER_BYTES == 100_000_000  # the format's limit (safetensors' MAX_HEADER_SIZE)


def test_a_header_at_the_limit_is_still_read(tmp_path):
    """A header of exactly the limit is read (and here refused as not JSON: zero bytes, a sparse file)."""
    path = tmp_path / "edge.safetensors"
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", MAX_HEADER_BYTES))
        fh.truncate(8 + MAX_HEADER_BYTES)
    with pytest.raises(CheckpointError, match="corrupt safetensors header \\(not JSON\\)"):
        SafetensorsFile(path)


def test_an_integer_past_the_digit_limit_in_a_header_is_corrupt(tmp_path):
    path = tmp_path / "digits.safetensors"
    head = ('{"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, ' + "9" * 5000 + "]}}").encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"\x01")
    with pytest.raises(CheckpointError, match=f"{path}: corrupt safetensors header"):
        SafetensorsFile(path)


def test_an_integer_past_the_digit_limit_in_config_json_names_the_file(tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama", "hidden_size": ' + "1" * 5000 + "}")
    with pytest.raises(ConfigError, match=f"{config}: not valid JSON"):
        ModelConfig.from_file(config)
