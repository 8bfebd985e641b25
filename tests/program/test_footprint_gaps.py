"""``program/footprint.model_footprint``'s default dtype: a model's size is quoted in bf16 (the checkpoints'
dtype) unless another is asked for; an fp32 default would double every byte count a caller reads."""

from __future__ import annotations

import torch

from nonstop.config import ModelConfig
from nonstop.program.footprint import model_footprint
from tests.tiny_configs import TINY_CONFIGS


def test_the_default_dtype_is_bfloat16():
    """Weight bytes of the tiny llama by default are 2 per value (all its tensors are 16-bit in bf16), half of
    the fp32 figure, and equal to an explicit bf16 footprint."""
    cfg = ModelConfig.from_hf_dict(TINY_CONFIGS["llama"])
    default, bf16, fp32 = (
        model_footprint(cfg),
        model_footprint(cfg, torch.bfloat16),
        model_footprint(cfg, torch.float32),
    )
    assert default == bf16
    assert default.weight_bytes == 2 * default.total_params and fp32.weight_bytes == 4 * fp32.total_params
