"""Writing checkpoints: checked before the work, staged, replacing an old checkpoint whole or not at all."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.build import load_model
from nonstop.train.export import save_checkpoint
from nonstop.train.trainer import init_model
from nonstop.weights.synth import write_checkpoint
from nonstop.weights.write import STAGING_PREFIX, CheckpointWriteError, check_output_dir
from tests.tiny_configs import KIMI_K3

CFG = ModelConfig.from_hf_dict(KIMI_K3)


def test_a_saved_model_replaces_a_sharded_checkpoint_already_there(tmp_path):
    """The loader prefers model.safetensors.index.json: a model saved over a sharded checkpoint must take
    the old index and shards with it, or the old weights load silently."""
    out = tmp_path / "ckpt"
    write_checkpoint(CFG, out, seed=7, dtype=torch.float32, max_shard_bytes=20_000)
    assert (out / "model.safetensors.index.json").exists() and len(list(out.glob("model-*.safetensors"))) > 1
    model = init_model(CFG, seed=3)
    save_checkpoint(model, out, dtype=torch.float32)
    assert sorted(p.name for p in out.glob("model*")) == ["model.safetensors"]
    loaded = load_model(CFG, out, torch.float32)
    want = model.state_dict()
    for name, t in loaded.state_dict().items():
        assert torch.equal(t, want[name]), name
    assert not list(out.glob(f"{STAGING_PREFIX}*"))


def test_a_failed_write_leaves_the_old_checkpoint_as_it_was(tmp_path, monkeypatch):
    out = tmp_path / "ckpt"
    write_checkpoint(CFG, out, seed=1, dtype=torch.float32)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    deeper = CFG.with_num_layers(CFG.num_hidden_layers - 1)

    import safetensors.torch

    calls = []

    def full_disk(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) == 2:  # the first shard is written, the second finds the disk full
            raise OSError(28, "No space left on device")
        return real(tensors, path, metadata=metadata)

    real = safetensors.torch.save_file
    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(CheckpointWriteError, match="No space left on device.*left as it was"):
        write_checkpoint(deeper, out, seed=2, dtype=torch.float32, max_shard_bytes=20_000)
    assert len(calls) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no new config beside old weights
    missing = tmp_path / "new"
    with pytest.raises(CheckpointWriteError):
        calls.clear()
        write_checkpoint(deeper, missing, seed=2, dtype=torch.float32, max_shard_bytes=20_000)
    assert not missing.exists()  # the directory the failed write made is gone too


@pytest.mark.parametrize("blocked", ["model.safetensors", "config.json", "second shard"])
def test_a_folder_where_a_new_file_goes_is_refused_before_anything_moves(tmp_path, blocked):
    """No file can replace a folder: the write is refused with the folder named, and the old checkpoint,
    the folder and the user's files stay as they were (the old weights were once deleted first, the new
    config moved in, and the staging folder left behind, under a bare OS error)."""
    shard = 20_000 if blocked == "second shard" else 4 << 30
    if blocked == "second shard":
        write_checkpoint(CFG, tmp_path / "probe", seed=2, dtype=torch.float32, max_shard_bytes=shard)
        blocked = sorted(p.name for p in (tmp_path / "probe").glob("model-*.safetensors"))[1]
    out = tmp_path / "ckpt"
    write_checkpoint(CFG, out, seed=1, dtype=torch.float32)
    (out / "notes.txt").write_text("mine")
    (out / blocked).unlink(missing_ok=True)
    (out / blocked).mkdir()
    (out / blocked / "inside").write_text("x")
    before = {p.name: (p.read_bytes() if p.is_file() else None) for p in out.iterdir()}
    with pytest.raises(CheckpointWriteError, match=f"{blocked} is a folder where .* left as it was"):
        write_checkpoint(CFG, out, seed=2, dtype=torch.float32, max_shard_bytes=shard)
    assert {p.name: (p.read_bytes() if p.is_file() else None) for p in out.iterdir()} == before
    assert (out / blocked / "inside").read_text() == "x"


def test_written_files_follow_the_umask(tmp_path):
    """safetensors creates its files 0600; a checkpoint's files are as readable as the user's umask allows."""
    old = os.umask(0o022)
    try:
        write_checkpoint(CFG, tmp_path / "a", dtype=torch.float32)
        save_checkpoint(init_model(CFG), tmp_path / "b", dtype=torch.float32)
    finally:
        os.umask(old)
    for d in ("a", "b"):
        for f in (tmp_path / d).iterdir():
            assert stat.S_IMODE(f.stat().st_mode) == 0o644, f


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: "", "is empty"),
        (lambda tmp: "  ", "is empty"),
        (lambda tmp: (tmp / "f").write_text("x") and tmp / "f", "is an existing file"),
        (lambda tmp: (tmp / "g").write_text("x") and tmp / "g" / "sub" / "dir", "which is a file"),
    ],
)
def test_an_output_path_a_checkpoint_cannot_go_to_is_refused_up_front(tmp_path, make, message):
    with pytest.raises(ValueError, match=message):
        check_output_dir(make(tmp_path))


def test_an_unwritable_parent_is_refused(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ValueError, match="permission denied"):
        check_output_dir(locked / "out")


def test_a_directory_yet_to_be_made_is_accepted(tmp_path):
    assert check_output_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert check_output_dir(tmp_path) == tmp_path  # an existing directory
