"""The cpu floor's numerator (``pack.streamed_bytes_per_token``, the meta model packed and costed) against the
bytes a real ``CPUExecutor`` holds that one decoded token reads, for int8 groups other than the default and for
a model whose hidden size the groups divide (the tiny families' 40 / 44 columns take one scale per row whatever
the group, so they cannot tell groups apart)."""

from __future__ import annotations

import copy

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.runtime.cpu import CPUExecutor
from nonstop.runtime.cpu.kernels import load_kernels
from nonstop.runtime.cpu.pack import streamed_bytes_per_token
from tests.runtime.test_cpu_streamed_weight_bytes import _read_per_token
from tests.tiny_configs import TINY_CONFIGS

KERNELS_MISSING = load_kernels(progress=False)


def _k3_64() -> ModelConfig:
    d = copy.deepcopy(TINY_CONFIGS["kimi_k3"])
    sizes = dict(hidden_size=64, routed_expert_hidden_size=32, intermediate_size=64, moe_intermediate_size=32)
    d["text_config"].update(sizes)
    return ModelConfig.from_hf_dict(d)


@pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"CPU kernels unavailable: {KERNELS_MISSING}")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("group", [8, 16])
def test_the_int8_floor_follows_the_executors_group(group):
    """16 / 32: kernel groups (whole 16-column chunks), more scales than per row; 8: a group the kernels cannot
    take (that weight computes in torch, untiled); 0: per channel."""
    cfg = _k3_64()
    ex = CPUExecutor(
        random_model(cfg, torch.float32), weights="int8", compile=False, threads=1, progress=False, int8_group=group
    )
    assert streamed_bytes_per_token(cfg, torch.float32, "int8", group=group) == _read_per_token(ex)


@pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"CPU kernels unavailable: {KERNELS_MISSING}")
def test_smaller_int8_groups_stream_more_scale_bytes():
    """Independent of the executor: a [N, 64] weight at group g carries N·64/g fp32 scales, so the floor must
    grow strictly as the group shrinks from per-channel (64) to 32 to 16."""
    cfg = _k3_64()
    per_channel, g32, g16 = (streamed_bytes_per_token(cfg, torch.float32, "int8", group=g) for g in (0, 32, 16))
    assert per_channel < g32 < g16
