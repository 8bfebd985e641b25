"""``attn_tiles.merge_splits`` and the RoPE magnitude, at values the tiny models never produce.

The merge's running max starts at -1e30 (``NEG``); the existing merge test draws scores around 0, so a merge
whose running max started at 0 gave the same result there. With every score far below zero (here about -300:
e^-300 underflows in fp32) such a merge lost every split. Separately, every tiny config has RoPE magnitude 1
(llama3 scaling; YaRN with mscale == mscale_all_dim), so a launch that dropped the op's ``rope_magnitude``
(the YaRN attention factor that scales cos and sin) passed; here YaRN configs without ``mscale_all_dim`` give
magnitude 0.1·ln(4) + 1.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from nonstop.config import ModelConfig
from nonstop.kernels import gqa, mla
from nonstop.kernels.attn_tiles import merge_splits
from nonstop.model.build import random_model
from nonstop.program.lower import lower
from tests.kernels.harness import check_kernel
from tests.kernels.paging import scattered_pages
from tests.tiny_configs import TINY_CONFIGS


@triton.jit
def _merge(ml_ptr, acc_ptr, n_valid_ptr, out_ptr, I, NS, D, BLOCK_I: tl.constexpr, BLOCK_D: tl.constexpr):
    items = tl.arange(0, BLOCK_I)
    n_valid = tl.load(n_valid_ptr + items, mask=items < I, other=0)
    o = merge_splits(ml_ptr, acc_ptr, items, n_valid, NS, D, BLOCK_D)
    d = tl.arange(0, BLOCK_D)
    tl.store(out_ptr + items[:, None] * D + d[None, :], o, mask=(items < I)[:, None] & (d < D)[None, :])


def test_merge_splits_with_every_score_far_below_zero():
    """Scores around -300 (all splits' maxima far below 0): the merged output must still be the softmax-weighted
    values (plain torch softmax over the valid splits' keys), not 0 from an underflowed denominator."""
    gen = torch.Generator().manual_seed(3)
    I, NS, S, D = 3, 3, 5, 7
    scores = torch.randn(I, NS, S, generator=gen) * 3 - 300
    values = torch.randn(I, NS, S, D, generator=gen)
    n_valid = torch.tensor([3, 1, 2])
    mx = scores.amax(-1)
    p = torch.exp(scores - mx[..., None])
    ml = torch.stack([mx, p.sum(-1)], -1).contiguous()
    acc = torch.einsum("isk,iskd->isd", p, values).contiguous()
    out = torch.empty(I, D)
    _merge[(1,)](ml, acc, n_valid, out, I, NS, D, BLOCK_I=4, BLOCK_D=8)
    for i in range(I):
        n = int(n_valid[i])
        probs = torch.softmax(scores[i, :n].reshape(-1).double(), 0)
        want = (probs @ values[i, :n].reshape(-1, D).double()).float()
        torch.testing.assert_close(out[i], want, rtol=1e-5, atol=1e-5)


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
