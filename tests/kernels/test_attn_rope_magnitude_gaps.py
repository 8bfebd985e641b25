"""The RoPE magnitude at values the tiny models never produce: every tiny config has magnitude 1 (llama3
scaling; YaRN with mscale == mscale_all_dim), so a launch that dropped the op's ``rope_magnitude`` (the YaRN
attention factor that scales cos and sin) passed; here YaRN configs without ``mscale_all_dim`` give magnitude
0.1·ln(4) + 1. (The split merge at scores far below zero is ``test_attn_tiles``' merge test, shifted.)
"""

from __future__ import annotations

import math

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.kernels import gqa, mla
from nonstop.model.build import random_model
from nonstop.program.lower import lower
from tests.kernels.harness import check_kernel
from tests.kernels.paging import scattered_pages
from tests.tiny_configs import TINY_CONFIGS


def _yarn(name: str) -> dict:
    raw = dict(TINY_CONFIGS[name])
    raw["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    return raw


@pytest.mark.parametrize(
    "kind,name,kernel",
    [("gqa_qkv_rope", "llama", gqa.KERNELS["gqa_qkv_rope"]), ("mla_q_up", "deepseek_v3", mla.KERNELS["mla_q_up"])],
)
def test_rope_magnitude_other_than_one(kind, name, kernel):
    """YaRN without mscale_all_dim scales cos and sin by 0.1·ln(4) + 1: the kernel must apply the op's
    ``rope_magnitude`` to q and k (q_pe and k_pe) as the twin does."""
    raw = _yarn(name)
    model = random_model(ModelConfig.from_hf_dict(raw), torch.float32, device="cpu", seed=0)
    magnitudes = {op.attrs["rope_magnitude"] for op in lower(model).ops if op.kind == kind}
    assert magnitudes and all(abs(m - (0.1 * math.log(4.0) + 1)) < 1e-6 for m in magnitudes), magnitudes
    assert check_kernel(kind, raw, scattered_pages(kernel), torch.float32, B=2, T=2, seed=6) > 0
