"""MoE kernels (``nonstop/kernels/moe.py``) against their twins at shapes the family configs leave out: MXFP4
experts whose widths cross a 32-element scale group inside a step and end in a ragged group, an expert
count and group width that are not powers of two (3 groups of 3), an odd intermediate width, and enough
rows that every expert is selected (as many slots as experts). One MoE layer each, so every case is small.

The twin (``program/reference.py``, plain torch) is the independent implementation, as in ``test_moe.py``.
"""

from __future__ import annotations

import pytest
import torch

from nonstop.kernels import moe
from tests.kernels.harness import check_kernel
from tests.tiny_configs import DEEPSEEK, KIMI_K3_MXFP4

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

F32 = torch.float32
SMALL = {"n": 16, "k": 16, "i": 16}
_TC = KIMI_K3_MXFP4["text_config"]


def _k3_mxfp4(**kw) -> dict:
    """K3 with MXFP4 experts cut to one MoE layer (layer 0 dense, layer 1 KDA + MoE, layer 2 full attention)."""
    linear = {**_TC["linear_attn_config"], "full_attn_layers": [2], "kda_layers": [1]}
    return {**KIMI_K3_MXFP4, "text_config": {**_TC, "num_hidden_layers": 2, "linear_attn_config": linear, **kw}}


def _deepseek(**kw) -> dict:
    return {**DEEPSEEK, "num_hidden_layers": 2, **kw}


@pytest.mark.parametrize("small", [False, True])
@pytest.mark.parametrize("inter,latent", [(40, 44), (36, 70)])
def test_mxfp4_experts_across_scale_groups(inter, latent, small, monkeypatch):
    """Expert width 40 / 36 and latent 44 / 70: the gate/up reduction (latent) and the down reduction (expert
    width) each span a full 32-group, then a ragged one (scales indexed k // 32 per row, bytes masked at KB);
    default blocks put the group boundary inside one step, 16-wide blocks put it at a step boundary (steps
    of 32, the MXFP4 minimum) with ragged 16-row gate/up chunks and 16-column down tiles."""
    if small:
        monkeypatch.setattr(moe, "INTERPRET_BLOCKS", SMALL)
    raw = _k3_mxfp4(moe_intermediate_size=inter, routed_expert_hidden_size=latent)
    assert check_kernel("moe_experts", raw, moe.KERNELS["moe_experts"], F32, B=2, T=2, seed=21) == 1


@pytest.mark.parametrize("kind", ["moe_front", "moe_experts", "moe_tail"])
def test_nine_experts_in_three_groups_with_odd_widths(kind, monkeypatch):
    """9 experts in 3 groups of 3 (group tile padded to 4 groups of 4 columns), top 3 of 2 groups, expert
    width 21 (16-row chunks: 16 + 5), hidden 36, shared width 21: 16-wide blocks give a ragged last tile
    in every kind (router 16 of 9, latent/copy 16+16+4, shared 16+5, down 16+16+4, tail 16+16+4)."""
    monkeypatch.setattr(moe, "INTERPRET_BLOCKS", SMALL)
    raw = _deepseek(n_routed_experts=9, n_group=3, topk_group=2, num_experts_per_tok=3, moe_intermediate_size=21)
    assert check_kernel(kind, raw, moe.KERNELS[kind], F32, B=3, T=2, seed=22) == 1


def test_every_expert_selected():
    """6 rows × top 3 of 4 experts: every expert is chosen, so slots = E = 4 and the last slot is the last
    expert (a slot count one short, or a slot bound off by one, drops or duplicates an expert)."""
    raw = _deepseek(n_routed_experts=4, n_group=1, topk_group=1, num_experts_per_tok=3)
    assert check_kernel("moe_experts", raw, moe.KERNELS["moe_experts"], F32, B=3, T=2, seed=23) == 1
