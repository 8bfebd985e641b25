"""Tensor-parallel loading from a checkpoint split into many files: each rank's part (MXFP4 experts and float
weights cut across file boundaries) equals the same cut of the single-process load, and the reader opens
each file once and closes every descriptor (a leaked fd per tensor would exhaust the limit on a real model)."""

from __future__ import annotations

import os

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.dist import Layout
from nonstop.dist.load import load_rank_state, take_shard
from nonstop.dist.shard import rank_shards
from nonstop.weights.loader import load_state_dict
from nonstop.weights.slices import SliceReader
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import KIMI_K3_MXFP4


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
@pytest.mark.timeout(120)
def test_rank_parts_from_many_shard_files_and_no_fd_leak(tmp_path):
    cfg = ModelConfig.from_hf_dict(KIMI_K3_MXFP4)
    ckpt = write_checkpoint(cfg, tmp_path / "ck", seed=3, dtype=torch.float32, max_shard_bytes=20_000)
    files = sorted(ckpt.glob("*.safetensors"))
    assert len(files) > 3  # really sharded
    full = load_state_dict(cfg, ckpt, torch.float32)
    lay = Layout.make(3, 3)
    for rank in range(lay.world):
        before = _open_fds()
        reader = SliceReader()
        state = load_rank_state(cfg, lay, rank, ckpt, torch.float32, reader=reader)
        assert len(reader._fds) <= len(files)  # one descriptor per file, reused across its tensors
        reader.close()
        assert _open_fds() == before  # every descriptor closed
        state2 = load_rank_state(cfg, lay, rank, ckpt, torch.float32)  # its own reader: closed too
        assert _open_fds() == before
        for s in rank_shards(cfg, lay, rank):
            want = take_shard(full[s.spec.param], s)
            assert torch.equal(state[s.spec.param], want), s.spec.param
            assert torch.equal(state2[s.spec.param], want), s.spec.param
