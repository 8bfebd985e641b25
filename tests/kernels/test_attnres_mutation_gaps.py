"""``attnres_mix_norm`` when the block buffer holds a power-of-two number of blocks (K3: 93 layers in blocks
of 12 = 8 blocks, whose final mix reads all 8 plus the partial sum: 9 sources). The tiny K3 of
``tests/kernels/test_attnres.py`` has 3 blocks (4 sources, already a power of two), so a source tile sized
for the blocks alone would pass there. Here: 6 layers in blocks of 3 = 2 blocks, final mix over 3 sources.
Compared with the twin inside a real step (kernel-side mutation; the harness poisons the outputs), with the
kernel's scratch filled with NaN first.
"""

from __future__ import annotations

import copy

import torch

from nonstop.kernels import attnres, launch
from tests.kernels.harness import check_kernel
from tests.tiny_configs import TINY_CONFIGS


def _stale_scratch_then_kernel(op, env):
    for (key, _, _), t in launch._WORKSPACES.items():
        if key in ("attnres.dots", "attnres.sq"):
            t.fill_(float("nan"))
    attnres.attnres_mix_norm(op, env)


def test_final_mix_over_a_power_of_two_number_of_blocks():
    raw = copy.deepcopy(TINY_CONFIGS["kimi_k3"])
    text = raw["text_config"]
    text["num_hidden_layers"] = 6
    text["linear_attn_config"]["full_attn_layers"] = [4]
    text["linear_attn_config"]["kda_layers"] = [1, 2, 3, 5, 6]
    checked = check_kernel("attnres_mix_norm", raw, _stale_scratch_then_kernel, torch.float32, B=2, T=1)
    assert checked == 13  # 6 layers x (attention, FFN) + the final mix
