"""The tuning store's files: kernel file names that cannot collide between winners, the one-line message for an
empty store path, and the entry the reader gets back (what ``record`` stores, read by ``runtime.tuned``)."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import pytest

from nonstop.runtime.tuned import kernel_problem, read_store
from nonstop.tune import store

KIND = "mlp"


def _entry() -> dict:
    return {"proposer": "test", "round": 1, "candidate": "r1c1", "timed": False, "time_ms": None}


def _two_sources_sharing_a_short_hash_prefix() -> tuple[str, str]:
    """Two kernel sources whose SHA-256 hex digests share their first 4 characters (found by search)."""
    seen: dict[str, str] = {}
    for i in itertools.count():
        source = f"# kernel {i}\n"
        prefix = hashlib.sha256(source.encode()).hexdigest()[:4]
        if prefix in seen:
            return seen[prefix], source
        seen[prefix] = source


def test_winners_whose_hashes_share_a_prefix_keep_their_own_files(tmp_path):
    """Two winners (at two shapes) whose SHA-256 begin alike must each keep a usable kernel file: a file name
    from too short a hash prefix makes the second overwrite the first's file, which then fails its hash
    check and drops out of the store (its place reads as empty)."""
    a, b = _two_sources_sharing_a_short_hash_prefix()
    path = tmp_path / "tuning.json"
    assert store.record(path, "cpu", KIND, "B1xT1 w=8x8 float32", a, _entry())
    assert store.record(path, "cpu", KIND, "B3xT1 w=8x8 float32", b, _entry())
    shapes = read_store(path)["entries"]["cpu"][KIND]
    assert kernel_problem(tmp_path, shapes["B1xT1 w=8x8 float32"]) is None
    assert kernel_problem(tmp_path, shapes["B3xT1 w=8x8 float32"]) is None
    assert (tmp_path / shapes["B1xT1 w=8x8 float32"]["kernel"]).read_text() == a
    assert (tmp_path / shapes["B3xT1 w=8x8 float32"]["kernel"]).read_text() == b


def test_the_kernel_file_is_named_by_kind_and_twelve_hash_characters():
    """``kernels/<kind>-<sha12>.py`` as the module docstring documents (hand-computed digest)."""
    source = "x = 1\n"
    sha = hashlib.sha256(b"x = 1\n").hexdigest()
    assert store.kernel_file("mlp", source) == (f"kernels/mlp-{sha[:12]}.py", sha)


def test_an_empty_store_path_is_named_as_empty(tmp_path, monkeypatch):
    """``--store ''`` must say the path is empty, not that the current directory is a directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="the tuning store path is empty"):
        store.check_writable(Path(""))


def test_a_recorded_entry_keeps_its_provenance_and_the_current_rules(tmp_path):
    """``record`` stores the caller's provenance next to the kernel, hash, rules and versions."""
    path = tmp_path / "tuning.json"
    assert store.record(path, "cpu", KIND, "k", "# src\n", {**_entry(), "model": "tiny"})
    e = json.loads(path.read_text())["entries"]["cpu"][KIND]["k"]
    assert e["model"] == "tiny" and e["proposer"] == "test" and e["candidate"] == "r1c1"
    assert e["sha256"] == hashlib.sha256(b"# src\n").hexdigest()
    assert store.rows(path)[0]["shape"] == "k"


def test_a_dangling_kernels_link_is_refused_before_tuning(tmp_path):
    """A ``kernels`` symlink to nowhere beside the store cannot take the winners' files: ``check_writable``
    must say so before any tuning (``exists()`` alone is False for it, and the failure came after the work)."""
    (tmp_path / "kernels").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="kernels"):
        store.check_writable(tmp_path / "tuning.json")


def test_a_directory_as_store_path_suggests_a_file_in_it(tmp_path):
    """A directory given as the store names the fix: a JSON file inside it."""
    with pytest.raises(ValueError, match="is a directory; give a JSON file path, e.g. .*tuning.json"):
        store.check_writable(tmp_path)


def test_rows_are_listed_in_device_kind_shape_order(tmp_path):
    """``tune --list`` lists by device, then kind, then shape, whatever order the file holds them in (a store
    written by another tool or by hand need not be sorted)."""
    path = tmp_path / "tuning.json"
    e = {"kernel": "kernels/x.py", "sha256": "0" * 64}
    entries = {"zeta gpu": {"mlp": {"b": e}}, "alpha gpu": {"mlp": {"b": e, "a": e}, "attn": {"a": e}}}
    path.write_text(json.dumps({"version": 1, "entries": entries}))
    got = [(r["device"], r["kind"], r["shape"]) for r in store.rows(path)]
    assert got == [
        ("alpha gpu", "attn", "a"),
        ("alpha gpu", "mlp", "a"),
        ("alpha gpu", "mlp", "b"),
        ("zeta gpu", "mlp", "b"),
    ]
