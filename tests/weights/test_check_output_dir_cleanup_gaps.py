"""``check_output_dir`` proves an output directory can be created by making it and its missing parents, then
removing exactly what it made (``weights/write._check_creatable``). Expected states follow from that contract:
nothing the user had is removed, nothing new is left behind."""

from __future__ import annotations

import os

import pytest

from nonstop.weights.write import check_output_dir


def test_a_deep_missing_path_is_accepted_and_leaves_nothing_behind(tmp_path):
    out = tmp_path / "a" / "b" / "c"
    assert check_output_dir(out) == out
    assert sorted(os.listdir(tmp_path)) == []  # a/, a/b/, a/b/c/ made and removed, deepest first


def test_an_existing_empty_directory_and_its_empty_parents_stay(tmp_path):
    kept = tmp_path / "empty" / "out"
    kept.mkdir(parents=True)
    check_output_dir(kept)
    assert kept.is_dir()
    check_output_dir(kept / "new")
    assert kept.is_dir() and not (kept / "new").exists()


def test_a_directory_created_meanwhile_is_not_removed_when_not_empty(tmp_path):
    out = tmp_path / "x" / "y"
    check_output_dir(out)
    out.mkdir(parents=True)
    (out / "keep.txt").write_text("mine")
    check_output_dir(out)
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (which refuses mkdir, even for root)")
def test_an_uncreatable_directory_is_one_error_naming_the_flag_and_the_reason():
    with pytest.raises(ValueError) as e:
        check_output_dir("/proc/nonstop-audit5/deeper", "--cache-dir", "the token cache")
    assert str(e.value) == (
        "--cache-dir /proc/nonstop-audit5/deeper: cannot create the directory (No such file or directory)"
    )
