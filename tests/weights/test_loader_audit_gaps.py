"""Gaps found by a mutation audit of ``nonstop/weights/loader.py``.

Expected values are set by hand here (which rows differ), not taken from the loader."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from nonstop.config import ModelConfig
from nonstop.model.build import load_model
from nonstop.weights.errors import CheckpointError
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import DEEPSEEK, KIMI_LINEAR_RELEASE

CFG = ModelConfig.from_hf_dict(KIMI_LINEAR_RELEASE)


def test_an_index_that_lists_no_tensors_is_named_as_such(tmp_path):
    """An index whose ``weight_map`` is ``{}`` beside its shards is refused for what it is (an empty index), not
    as stray shard files or a missing tensor. Catches the empty-index check dropped."""
    out = write_checkpoint(CFG, tmp_path / "s", dtype=torch.float32, max_shard_bytes=20_000)
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] = {}
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="the index lists no tensors"):
        load_model(CFG, out)


def test_an_fp8_scale_of_the_wrong_block_shape_is_refused(tmp_path):
    """The tiny DeepSeek weight's blocks cover it with one scale ([1, 1], as the repo's fp8 test writes it); a
    [1, 2] ``weight_scale_inv`` is not that layout and must be refused naming both shapes, not broadcast
    silently (the gather by row/column block index would read only its first column)."""
    cfg = ModelConfig.from_hf_dict(DEEPSEEK)
    out = write_checkpoint(cfg, tmp_path / "ds", seed=1, dtype=torch.float32)
    name = "model.layers.0.self_attn.q_b_proj.weight"
    tensors = load_file(str(out / "model.safetensors"))
    tensors[name] = (tensors[name] / 0.01).to(torch.float8_e4m3fn)
    tensors[name.replace(".weight", ".weight_scale_inv")] = torch.full((1, 2), 0.01)
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"weight_scale_inv' .*has shape \[1, 2\], expected \[1, 1\]"):
        load_model(cfg, out)


def test_an_fp8_weight_without_its_scale_is_named_not_a_key_error(tmp_path):
    """An fp8 weight whose ``weight_scale_inv`` is absent cannot be dequantised: one CheckpointError naming the
    weight and the missing scale. Catches the presence check dropped (a bare KeyError from the scale lookup)."""
    cfg = ModelConfig.from_hf_dict(DEEPSEEK)
    out = write_checkpoint(cfg, tmp_path / "ds", seed=1, dtype=torch.float32)
    name = "model.layers.0.self_attn.q_b_proj.weight"
    tensors = load_file(str(out / "model.safetensors"))
    tensors[name] = (tensors[name] / 0.01).to(torch.float8_e4m3fn)
    save_file(tensors, str(out / "model.safetensors"))
    scale = name.replace(".weight", ".weight_scale_inv")
    with pytest.raises(CheckpointError, match=rf"'{name}' in model.safetensors is fp8 but its scale '{scale}' is"):
        load_model(cfg, out)
