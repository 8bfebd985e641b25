"""Checkpoints two engines would read differently: a ``*.safetensors`` file beside the index that the index
does not name (transformers reads a ``model.safetensors`` before the index), and an fp8 ``weight_scale_inv``
beside a weight that is not fp8 (a half-converted checkpoint). nonstop refuses both with one error line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from nonstop.cli import main
from nonstop.config import ModelConfig
from nonstop.weights.errors import CheckpointError
from nonstop.weights.loader import checkpoint_files, resolve_checkpoint
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import DEEPSEEK, LLAMA

INDEX = "model.safetensors.index.json"
LLAMA_CFG = ModelConfig.from_hf_dict(LLAMA)
DS_CFG = ModelConfig.from_hf_dict(DEEPSEEK)
Q_B = "model.layers.0.self_attn.q_b_proj.weight"
Q_B_SCALE = "model.layers.0.self_attn.q_b_proj.weight_scale_inv"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """(single-file llama checkpoint, the same sharded with an index, single-file deepseek checkpoint)."""
    root = tmp_path_factory.mktemp("stray")
    single = write_checkpoint(LLAMA_CFG, root / "single", seed=3, dtype=torch.float32)
    sharded = write_checkpoint(LLAMA_CFG, root / "sharded", seed=4, dtype=torch.float32, max_shard_bytes=20_000)
    deepseek = write_checkpoint(DS_CFG, root / "deepseek", seed=1, dtype=torch.float32)
    for d in (single, sharded, deepseek):
        (d / "tokenizer_config.json").write_text("{}")
    return single, sharded, deepseek


def _cli_error(args: list[str], capsys) -> str:
    """The one ``nonstop: error:`` line of a command that must exit with status 2 and no traceback."""
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("nonstop: error:")]
    assert e.value.code == 2 and len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def _commands(d) -> list[list[str]]:
    return [
        ["info", "--model", str(d)],
        ["generate", "--model", str(d), "--prompt-ids", "1,2", "-n", "1", "--no-preflight"],
    ]


def test_an_index_naming_every_file_loads(pristine):
    sharded = pristine[1]
    shards = set(json.loads((sharded / INDEX).read_text())["weight_map"].values())
    assert len(shards) > 1 and shards == {p.name for p in sharded.glob("*.safetensors")}
    (sharded / "README.md").write_text("not a weight file")  # other files beside the index are not weights
    try:
        located = checkpoint_files(sharded)
    finally:
        (sharded / "README.md").unlink()
    assert {f.path.name for f in located.values()} == shards


def test_a_stray_model_safetensors_beside_the_index_is_refused(pristine, tmp_path, capsys):
    d = shutil.copytree(pristine[1], tmp_path / "mixed")
    shutil.copy(pristine[0] / "model.safetensors", d / "model.safetensors")  # what transformers would load
    with pytest.raises(CheckpointError, match=rf"model\.safetensors, which {INDEX} does not list"):
        checkpoint_files(d)
    for args in _commands(d):
        line = _cli_error(args, capsys)
        assert "model.safetensors," in line and f"{INDEX} does not list" in line and "remove" in line, line


def test_every_unlisted_shard_is_named(pristine, tmp_path):
    d = shutil.copytree(pristine[1], tmp_path / "extra")
    first = sorted(d.glob("model-*.safetensors"))[0]
    shutil.copy(first, d / "model-extra.safetensors")
    shutil.copy(pristine[0] / "model.safetensors", d / "model.safetensors")
    with pytest.raises(CheckpointError, match=rf"holds model-extra\.safetensors, model\.safetensors, which {INDEX}"):
        checkpoint_files(d)


def _add_scale(d, cast: torch.dtype | None) -> None:
    """Give ``Q_B`` a ``weight_scale_inv`` of 0.01, storing the weight as ``cast`` first (None: as it is)."""
    path = d / "model.safetensors"
    tensors = load_file(str(path))
    if cast is not None:
        tensors[Q_B] = tensors[Q_B].to(cast)
    tensors[Q_B_SCALE] = torch.full((1, 1), 0.01)
    save_file(tensors, str(path))


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_a_scale_beside_a_weight_that_is_not_fp8_is_refused(pristine, tmp_path, capsys, dtype):
    d = shutil.copytree(pristine[2], tmp_path / "half")
    _add_scale(d, dtype)
    with pytest.raises(CheckpointError, match=rf"{Q_B_SCALE!r} in model\.safetensors .* of {Q_B!r}.* not fp8"):
        resolve_checkpoint(DS_CFG, d)  # from the headers alone
    for args in _commands(d):
        line = _cli_error(args, capsys)
        assert Q_B_SCALE in line and Q_B in line and "not fp8" in line and "ignored" in line, line


def test_a_scale_beside_an_fp8_weight_is_read(pristine, tmp_path):
    d = shutil.copytree(pristine[2], tmp_path / "fp8")
    _add_scale(d, torch.float8_e4m3fn)
    located, _, _ = resolve_checkpoint(DS_CFG, d)
    assert located[Q_B].meta(Q_B)[0] == torch.float8_e4m3fn and Q_B_SCALE in located
