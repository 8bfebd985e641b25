"""Folders of code nonstop imports later (generated megakernel source, the C++ CPU kernels) are this
user's alone, and a generated module is imported only when its file holds exactly the generated source."""

from __future__ import annotations

import os
import stat

import pytest

from nonstop.cache_dirs import cache_root, private_dir


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("NONSTOP_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("NONSTOP_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "nonstop"
    monkeypatch.setenv("NONSTOP_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_a_new_private_folder_is_for_its_owner_only(root):
    path = private_dir("megakernel")
    assert path == root / "megakernel" and path.is_dir()
    assert _mode(path) & 0o077 == 0


def test_a_folder_others_may_write_loses_their_write_access(root):
    (root / "ext").mkdir(parents=True)
    os.chmod(root / "ext", 0o777)
    private_dir("ext")
    assert _mode(root / "ext") == 0o755


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_another_user_owns_is_refused(root):
    (root / "ext").mkdir(parents=True)
    os.chown(root / "ext", 4321, 4321)
    with pytest.raises(PermissionError, match="user id 4321 owns it"):
        private_dir("ext")


def test_a_file_in_place_of_the_folder_is_refused(root):
    root.mkdir()
    (root / "ext").write_text("not a folder")
    with pytest.raises(FileExistsError):
        private_dir("ext")


def test_a_planted_generated_module_is_replaced_by_the_real_source(root):
    import hashlib

    from nonstop.runtime.megakernel.codegen import source

    text = "VALUE = 1\n"
    name = f"_nonstop_mk_plantcheck_{hashlib.sha1(text.encode()).hexdigest()[:16]}"
    (root / "megakernel").mkdir(parents=True)
    (root / "megakernel" / f"{name}.py").write_text("VALUE = 2\n")
    module = source.load_source("plantcheck", text)
    assert module.VALUE == 1
    assert (root / "megakernel" / f"{name}.py").read_text() == text


def test_cpu_kernels_in_a_cache_that_cannot_be_made_fall_back_with_the_reason(root, monkeypatch):
    from nonstop.runtime.cpu import kernels

    root.parent.mkdir(exist_ok=True)
    root.write_text("a file where the cache folder should be")
    monkeypatch.setattr(kernels, "_state", {})
    reason = kernels.load_kernels(progress=False)
    assert reason is not None and str(root) in reason
