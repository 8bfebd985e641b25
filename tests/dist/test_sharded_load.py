"""Sharded loading: each rank reads only its bytes of the checkpoint, and gets exactly its part; a rank's
random weights (presets) are exactly its cut of the whole random model."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from nonstop.config import ModelConfig
from nonstop.dist import ExpertPlacement, Layout
from nonstop.dist.load import is_expert, load_rank_state, random_rank_state, take_shard
from nonstop.dist.shard import rank_shards
from nonstop.weights.loader import load_state_dict
from nonstop.weights.slices import SliceReader
from nonstop.weights.synth import random_state_dict, write_checkpoint
from tests.tiny_configs import DEEPSEEK, KIMI_K3_MXFP4

DISK_BYTES = {"float": 4, "fp32": 4, "u8": 1}  # float32 checkpoints below


@pytest.mark.parametrize("raw,tp,ep,share", [(KIMI_K3_MXFP4, 3, 3, 0.9), ("nano", 2, 4, 0.7), ("nano", 4, 8, 0.45)])
def test_each_rank_reads_only_its_share(tmp_path, raw, tp, ep, share):
    cfg = ModelConfig.from_file("nonstop/assets/k3-nano") if raw == "nano" else ModelConfig.from_hf_dict(raw)
    ckpt = write_checkpoint(cfg, tmp_path / "ckpt", seed=5, dtype=torch.float32)
    file_bytes = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    full = load_state_dict(cfg, ckpt, torch.float32)
    lay = Layout.make(tp, ep)
    for rank in range(lay.world):
        reader = SliceReader()
        state = load_rank_state(cfg, lay, rank, ckpt, torch.float32, reader=reader)
        shards = rank_shards(cfg, lay, rank)
        for s in shards:
            assert torch.equal(state[s.spec.param], take_shard(full[s.spec.param], s)), s.spec.param
        wanted = sum(
            (s.numel - (s.pad * s.numel // s.shape[s.dim] if s.pad else 0)) * DISK_BYTES[s.spec.kind] for s in shards
        )
        assert reader.bytes_read == wanted  # exactly the rank's elements, not a byte more
        assert reader.bytes_read < file_bytes * share  # its heads, vocabulary rows, experts + replicated small tensors


def test_fp8_block_scaled_parts_are_dequantised_like_the_whole(tmp_path):
    raw = {**DEEPSEEK, "quantization_config": {"quant_method": "fp8", "weight_block_size": [4, 8]}}
    cfg = ModelConfig.from_hf_dict(raw)
    ckpt = write_checkpoint(cfg, tmp_path / "ds", seed=2, dtype=torch.float32)
    path = ckpt / "model.safetensors"
    tensors = load_file(str(path))
    gen = torch.Generator().manual_seed(0)
    for name in [
        "model.layers.0.self_attn.q_b_proj.weight",
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
    ]:
        w = tensors[name]
        n, k = w.shape
        scale = torch.rand(-(-n // 4), -(-k // 8), generator=gen) * 0.02 + 0.005
        expanded = scale.repeat_interleave(4, 0).repeat_interleave(8, 1)[:n, :k]
        tensors[name] = (w / expanded).to(torch.float8_e4m3fn)
        tensors[name.replace(".weight", ".weight_scale_inv")] = scale
    save_file(tensors, str(path))
    full = load_state_dict(cfg, ckpt, torch.float32)
    lay = Layout.make(tp=3, ep=2, world=6)
    for rank in range(lay.world):
        state = load_rank_state(cfg, lay, rank, ckpt, torch.float32)
        for s in rank_shards(cfg, lay, rank):
            torch.testing.assert_close(state[s.spec.param], take_shard(full[s.spec.param], s), rtol=0, atol=0)


@pytest.mark.parametrize("raw,tp,ep", [(KIMI_K3_MXFP4, 3, 3), ("nano", 2, 4), ("nano", 4, 8)])
def test_random_rank_parts_are_the_cut_of_the_whole_random_model(raw, tp, ep):
    """Drawn tensor by tensor and cut at once, a rank's random part equals the whole random model's cut."""
    cfg = ModelConfig.from_file("nonstop/assets/k3-nano") if raw == "nano" else ModelConfig.from_hf_dict(raw)
    full = random_state_dict(cfg, torch.float32, seed=4)
    placement = ExpertPlacement.rebalanced(torch.arange(cfg.moe.num_experts, dtype=torch.float), ep, redundant=1)
    lay = Layout.make(tp, ep, placement=placement)  # uneven, with a replica: slots are not contiguous ids
    for rank in range(lay.world):
        state = random_rank_state(cfg, lay, rank, torch.float32, seed=4)
        shards = rank_shards(cfg, lay, rank)
        assert set(state) == {s.spec.param for s in shards}
        for s in shards:
            want = take_shard(full[s.spec.param], s)
            assert state[s.spec.param].dtype == want.dtype and torch.equal(state[s.spec.param], want), s.spec.param
    experts = random_rank_state(cfg, lay, 1, torch.float32, seed=4, only=is_expert)
    assert experts and all(is_expert(p) for p in experts)


def test_a_rank_says_fp16_overflow_not_corrupt_data(tmp_path):
    """As the single-device loader: a finite fp32 weight beyond float16's range is named as such."""
    from nonstop.weights.errors import CheckpointError

    cfg = ModelConfig.from_hf_dict(DEEPSEEK)
    ckpt = write_checkpoint(cfg, tmp_path / "ckpt", seed=5, dtype=torch.float32)
    path = ckpt / "model.safetensors"
    tensors = load_file(str(path))
    name = next(n for n in tensors if n.endswith("embed_tokens.weight"))
    tensors[name][0, 0] = 1e6
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match="beyond float16's range"):
        load_rank_state(cfg, Layout.make(1, 2), 0, ckpt, torch.float16)
