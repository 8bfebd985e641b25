"""Gaps in the tests of ``nonstop.weights.resolve`` found by a mutation audit: what a name that is a file, a
dangling link, a bundled model or a path with more than one slash resolves to, and devices this machine
cannot use."""

from __future__ import annotations

import os

import pytest
import torch

from nonstop.config import ConfigError
from nonstop.weights.resolve import check_device, resolve_model


def test_a_bundled_model_resolves_to_its_directory():
    """Catches the bundled-model lookup dropped (``k3-nano`` would be an unknown name)."""
    cfg, path = resolve_model("k3-nano")
    assert path is not None and path.name == "k3-nano" and (path / "config.json").is_file()
    assert cfg.family == "kimi_k3"


def test_a_preset_resolves_to_random_weights():
    """A preset has no directory (random weights)."""
    cfg, path = resolve_model("llama-3.2-1b")
    assert path is None and cfg.family == "llama"


def test_a_file_is_told_to_give_the_directory(tmp_path):
    """A path to a file (e.g. model.safetensors itself): catches the file case dropped (an unknown name)."""
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"model.safetensors is not a directory: give the checkpoint directory"):
        resolve_model(f)


def test_a_dangling_link_is_named_as_one(tmp_path):
    """A link to a checkpoint directory that is gone: catches the broken-link case dropped (an unknown name)."""
    link = tmp_path / "ckpt"
    os.symlink(tmp_path / "gone", link)
    with pytest.raises(ConfigError, match=r"ckpt: cannot read \(a broken symbolic link\)"):
        resolve_model(link)


@pytest.mark.parametrize("model", ["owner/name/extra", "./local/dir"])
def test_only_an_owner_slash_name_gets_the_hub_hint(model):
    """A path of more or other parts is no Hub repository: catches ``fullmatch`` loosened to ``match``."""
    with pytest.raises(ConfigError) as err:
        resolve_model(model)
    assert "Hugging Face Hub" not in str(err.value) and "neither a checkpoint directory nor a known name" in str(
        err.value
    )


def test_cuda_without_a_gpu_says_so(monkeypatch):
    """Catches the no-GPU check dropped (the index check would then say "only 0 CUDA device(s)")."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device 'cuda:0' asked for, but this torch .* sees no CUDA GPU"):
        check_device("cuda:0")


@pytest.mark.parametrize("device", [None, 3.5])
def test_a_device_of_the_wrong_type_is_a_value_error(device):
    """``torch.device(None)`` raises TypeError: catches TypeError dropped from the errors turned into the
    ValueError every caller expects."""
    with pytest.raises(ValueError, match=r"is not a device torch knows"):
        check_device(device)
