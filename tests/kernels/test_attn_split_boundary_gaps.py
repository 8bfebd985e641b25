"""Split-KV attention (``gqa_attn``, ``mla_attn``) when a sequence ends exactly on a split boundary.

``tests/kernels/test_gqa.py`` / ``test_mla.py`` use prompts whose ends (6, 8, 21, 23, 38, 40) never equal a
multiple of the 16- or 32-key split, so the "all keys fit one split" test (end <= SPLIT), the combine tile's
guard (end > SPLIT) and the number of splits a row merges (pos // SPLIT + 1) are never exercised at
equality. Here prompts of 15 and 31 tokens plus one new token end at 16 and 32 (and 13 / 29 plus three
tokens at T = 3; a third, 37-token prompt is prefilled but not stepped: it sizes the pools past the
pages the step adds). The merge scratch is poisoned with NaN first, so a row that merges a split no tile wrote
this launch fails instead of reading a leftover partial; the kernels' outputs are poisoned by the harness.
"""

from __future__ import annotations

import functools

import pytest
import torch

from nonstop.kernels import gqa, launch, mla
from tests.kernels.harness import check_kernel
from tests.tiny_configs import TINY_CONFIGS


def _poisoned_scratch(kernel, prefix: str):
    def run(op, env):
        for name in ("ml", "acc"):
            launch.workspace(f"{prefix}.{name}", 1 << 16, torch.float32, "cpu").fill_(float("nan"))
        return kernel(op, env)

    return run


@pytest.mark.parametrize("split", [16, 32])
@pytest.mark.parametrize("T,prompts", [(1, (15, 31, 37)), (3, (13, 29, 37))])
def test_gqa_attn_sequence_ending_on_a_split_boundary(split, T, prompts):
    fn = _poisoned_scratch(functools.partial(gqa.KERNELS["gqa_attn"], split_tokens=split), "gqa_attn")
    assert check_kernel("gqa_attn", TINY_CONFIGS["llama"], fn, torch.float32, B=3, T=T, prompt_lens=prompts) > 0


@pytest.mark.parametrize("split", [16, 32])
@pytest.mark.parametrize("T,prompts", [(1, (15, 31, 37)), (3, (13, 29, 37))])
def test_mla_attn_sequence_ending_on_a_split_boundary(split, T, prompts):
    fn = _poisoned_scratch(functools.partial(mla.KERNELS["mla_attn"], split_tokens=split), "mla_attn")
    assert check_kernel("mla_attn", TINY_CONFIGS["deepseek_v3"], fn, torch.float32, B=3, T=T, prompt_lens=prompts) > 0
