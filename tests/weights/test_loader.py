"""Checkpoint loading: single file and sharded, aliases, fp8, and every error kind naming tensor and file."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from nonstop.config import ModelConfig
from nonstop.model.build import load_model, random_model
from nonstop.weights.errors import CheckpointError
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import DEEPSEEK, KIMI_K3_MXFP4, KIMI_LINEAR_RELEASE

CFG = ModelConfig.from_hf_dict(KIMI_LINEAR_RELEASE)


@pytest.fixture()
def ckpt(tmp_path):
    return write_checkpoint(CFG, tmp_path / "m", seed=5, dtype=torch.float32)


def _rewrite(path, change):
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def _same_params(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0)


def test_single_and_sharded_load_the_same_weights(tmp_path):
    one = write_checkpoint(CFG, tmp_path / "one", seed=5, dtype=torch.float32)
    many = write_checkpoint(CFG, tmp_path / "many", seed=5, dtype=torch.float32, max_shard_bytes=20_000)
    assert (many / "model.safetensors.index.json").exists() and len(list(many.glob("model-*.safetensors"))) > 2
    _same_params(load_model(CFG, one), load_model(CFG, many))
    _same_params(load_model(CFG, one), random_model(CFG, torch.float32, seed=5))


def test_dtype_conversion_keeps_fp32_parameters(ckpt):
    m = load_model(CFG, ckpt, dtype=torch.bfloat16)
    assert m.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert m.layers[0].self_attn.A_log.dtype == torch.float32 and m.layers[1].mlp.gate.weight.dtype == torch.float32


def test_dense_layer_alias_block_sparse_moe(ckpt):
    def rename(t):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            t[f"model.layers.0.block_sparse_moe.{proj}.weight"] = t.pop(f"model.layers.0.mlp.{proj}.weight")

    _rewrite(ckpt / "model.safetensors", rename)
    _same_params(load_model(CFG, ckpt), random_model(CFG, torch.float32, seed=5))


def test_missing_tensor(ckpt):
    _rewrite(ckpt / "model.safetensors", lambda t: t.pop("model.layers.2.self_attn.dt_bias"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model.layers.2.self_attn.dt_bias'.*model.safetensors"):
        load_model(CFG, ckpt)


def test_unexpected_tensor(ckpt):
    _rewrite(ckpt / "model.safetensors", lambda t: t.update({"model.layers.1.self_attn.extra.weight": torch.zeros(2)}))
    with pytest.raises(
        CheckpointError, match=r"unexpected tensor 'model.layers.1.self_attn.extra.weight' in model.safetensors"
    ):
        load_model(CFG, ckpt)


def test_tensors_of_no_elements_are_not_unexpected(ckpt):
    """transformers saves the shared-expert projections of ``n_shared_experts: 0`` as [H, 0] / [0, H]: they hold
    nothing, so the checkpoint loads with every weight it has; one element makes the same name unexpected."""
    empty = {"model.layers.1.mlp.shared_experts.down_proj.weight": torch.zeros(42, 0)}
    _rewrite(ckpt / "model.safetensors", lambda t: t.update(empty))
    _same_params(load_model(CFG, ckpt), random_model(CFG, torch.float32, seed=5))
    _rewrite(ckpt / "model.safetensors", lambda t: t.update({k: torch.zeros(42, 1) for k in empty}))
    with pytest.raises(CheckpointError, match="unexpected tensor 'model.layers.1.mlp.shared_experts.down_proj"):
        load_model(CFG, ckpt)


def test_wrong_shape(ckpt):
    _rewrite(ckpt / "model.safetensors", lambda t: t.update({"model.norm.weight": torch.ones(41)}))
    with pytest.raises(
        CheckpointError, match=r"'model.norm.weight' in model.safetensors has shape \[41\], expected \[42\]"
    ):
        load_model(CFG, ckpt)


def test_wrong_dtype(ckpt):
    _rewrite(ckpt / "model.safetensors", lambda t: t.update({"model.norm.weight": torch.ones(42, dtype=torch.int32)}))
    with pytest.raises(CheckpointError, match=r"'model.norm.weight' in model.safetensors has dtype torch.int32"):
        load_model(CFG, ckpt)


def test_packed_experts_must_be_uint8(tmp_path):
    cfg = ModelConfig.from_hf_dict(KIMI_K3_MXFP4)
    out = write_checkpoint(cfg, tmp_path / "k3", dtype=torch.float32)
    name = "language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight_packed"
    _rewrite(out / "model.safetensors", lambda t: t.update({name: t[name].float()}))
    with pytest.raises(
        CheckpointError,
        match=r"experts.3.w2.weight_packed' in model.safetensors has dtype torch.float32, expected torch.uint8",
    ):
        load_model(cfg, out)


def test_truncated_file(ckpt):
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match=r"model.safetensors: truncated file: tensor '.*' ends at byte"):
        load_model(CFG, ckpt)


def test_corrupt_header(ckpt):
    path = ckpt / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:20] = b"not json!!!!"
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        load_model(CFG, ckpt)
    path.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_model(CFG, ckpt)


def test_sharded_errors(tmp_path):
    out = write_checkpoint(CFG, tmp_path / "s", dtype=torch.float32, max_shard_bytes=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00099.safetensors"
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        CheckpointError, match=r"shard 'model-00001-of-00099.safetensors' .*'model.norm.weight'.* is missing"
    ):
        load_model(CFG, out)
    index["weight_map"]["model.norm.weight"] = "model-00001-of-" + next(out.glob("model-00001-*")).name.split("-of-")[1]
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="listed in shard .* but that file does not contain it"):
        load_model(CFG, out)


def test_no_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no safetensors checkpoint"):
        load_model(CFG, tmp_path)


def test_fp8_block_weights_are_dequantised(tmp_path):
    cfg = ModelConfig.from_hf_dict(DEEPSEEK)
    out = write_checkpoint(cfg, tmp_path / "ds", seed=1, dtype=torch.float32)
    name = "model.layers.0.self_attn.q_b_proj.weight"

    def to_fp8(t):
        w = t[name]
        scale = torch.full((1, 1), 0.01)
        t[name] = (w / 0.01).to(torch.float8_e4m3fn)
        t[name.replace(".weight", ".weight_scale_inv")] = scale

    _rewrite(out / "model.safetensors", to_fp8)
    expected = load_file(str(out / "model.safetensors"))[name].float() * 0.01
    got = load_model(cfg, out).layers[0].self_attn.q_b_proj.weight
    torch.testing.assert_close(got, expected)
