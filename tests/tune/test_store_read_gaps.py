"""Reading a tuning store that cannot be used: every malformed level is a ``StoreError`` naming where, never a
traceback, and a directory or special file in the store's place is named as what it is."""

from __future__ import annotations

import json
import os

import pytest

from nonstop.runtime.tuned import StoreError, load_store, read_store

GOOD = {"kernel": "kernels/mlp-0.py", "sha256": "0" * 64}


@pytest.mark.parametrize(
    "entries, where",
    [
        ({"cpu": {"mlp": ["not", "a", "dict"]}}, "entries['cpu']['mlp'] is not an object"),
        ({"cpu": {"mlp": "text"}}, "entries['cpu']['mlp'] is not an object"),
        ({"cpu": {"mlp": {"B1": 3}}}, "entries['cpu']['mlp']['B1'] is not an object"),
        ({"cpu": {"mlp": {"B1": GOOD}, "attn": 7}}, "entries['cpu']['attn'] is not an object"),
    ],
)
def test_a_kind_or_entry_that_is_not_an_object_is_a_store_error(tmp_path, entries, where):
    """A kind's shapes (or one entry) of the wrong JSON type must raise ``StoreError`` with its place, not an
    ``AttributeError`` traceback from the reader."""
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"version": 1, "entries": entries}))
    with pytest.raises(StoreError) as info:
        read_store(path)
    assert where in str(info.value)
    assert load_store(path) == {"version": 1, "entries": {}}


def test_a_directory_in_the_stores_place_is_named_a_directory(tmp_path):
    """The message says the store path is a directory (the fix: give a file), not "not a regular file"."""
    with pytest.raises(StoreError, match="is a directory, not a JSON file"):
        read_store(tmp_path)


@pytest.mark.timeout(20)
def test_a_fifo_in_the_stores_place_is_refused_without_blocking(tmp_path):
    """A named pipe at the store path is not read (reading it would block for ever)."""
    path = tmp_path / "tuning.json"
    os.mkfifo(path)
    with pytest.raises(StoreError, match="is not a regular file"):
        read_store(path)


def test_a_store_cut_short_is_a_store_error(tmp_path):
    """Half a JSON file (a write cut short by another tool) is reported, not used."""
    path = tmp_path / "tuning.json"
    text = json.dumps({"version": 1, "entries": {"cpu": {"mlp": {"B1": GOOD}}}})
    path.write_text(text[: len(text) // 2])
    with pytest.raises(StoreError, match="is not valid JSON"):
        read_store(path)


def test_a_store_that_is_not_utf8_says_so(tmp_path):
    """Bytes that are not UTF-8 are named as such (json raises UnicodeDecodeError, a ValueError)."""
    path = tmp_path / "tuning.json"
    path.write_bytes(b'{"version": 1, "entries": {"\xff\xfe": {}}}')
    with pytest.raises(StoreError, match=r"not valid JSON \(not UTF-8 text\)"):
        read_store(path)
