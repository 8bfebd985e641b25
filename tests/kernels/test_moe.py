"""MoE super-op kernels (``nonstop/kernels/moe.py``) against their twins, and their building blocks
(SiTU / SwiGLU, in-kernel expert selection) against the torch versions (MXFP4: ``test_gemv.py``).

Configs: deepseek_v3 (grouped top-k, SwiGLU, non-latent), kimi_linear (non-latent), kimi_k3 (latent,
SiTU, 2 shared experts), kimi_k3_mxfp4 (+ MXFP4 experts, latent 22: a ragged 32-group), and
``DEEPSEEK_MANY_EXPERTS`` (36 experts: several router tiles). B·T rows with T = 3 let several rows of a
sequence share or split experts; every row count takes the tensor-core path (rows padded to 16:
``platform.row_block``). Runs under the Triton interpreter on a CPU.
"""

from __future__ import annotations

import pytest
import torch

from nonstop.config import MoEConfig
from nonstop.kernels import moe
from nonstop.model.activations import glu
from nonstop.model.moe import select_experts
from tests.kernels.harness import check_kernel
from tests.kernels.probes import gated_activation, route_slots
from tests.tiny_configs import DEEPSEEK_MANY_EXPERTS, TINY_CONFIGS

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # σ(-large) in numpy

MOE_CONFIGS = ("deepseek_v3", "kimi_linear", "kimi_k3", "kimi_k3_mxfp4")
F32, F16 = torch.float32, torch.float16
# (config, dtype, B, T, seed): every config once or twice, both dtypes, B = 1..3, T = 1 and 3 (fp16 steps
# cost the harness most: CPU fp16 convolutions in the reference prefill)
FRONT_TAIL_CASES = [
    ("deepseek_v3", F32, 1, 3, 0),
    ("kimi_linear", F16, 3, 1, 1),
    ("kimi_k3", F32, 1, 1, 2),
    ("kimi_k3", F16, 2, 3, 3),
    ("kimi_k3_mxfp4", F32, 3, 3, 4),
]
EXPERT_CASES = (
    [(c, F32, 1, 1, i) for i, c in enumerate(MOE_CONFIGS)]
    + [(c, F16, 3, 3, 5 + i) for i, c in enumerate(MOE_CONFIGS)]
    + [
        ("deepseek_v3", F32, 2, 3, 9),
    ]
)  # (+ kimi_k3_mxfp4 fp32 B=2 T=3 with small blocks below)


@pytest.mark.parametrize("config,dtype,B,T,seed", FRONT_TAIL_CASES)
@pytest.mark.parametrize("kind", ["moe_front", "moe_tail"])
def test_front_and_tail_match_twins(kind, config, dtype, B, T, seed):
    assert check_kernel(kind, TINY_CONFIGS[config], moe.KERNELS[kind], dtype, B=B, T=T, seed=seed) > 0


@pytest.mark.parametrize("config,dtype,B,T,seed", EXPERT_CASES)
def test_experts_match_twin(config, dtype, B, T, seed):
    assert check_kernel("moe_experts", TINY_CONFIGS[config], moe.KERNELS["moe_experts"], dtype, B=B, T=T, seed=seed) > 0


@pytest.mark.parametrize(
    "kind,config,dtype,B,T",
    [
        ("moe_front", "kimi_k3", F32, 1, 1),
        ("moe_front", "deepseek_v3", F16, 1, 3),
        ("moe_experts", "kimi_k3_mxfp4", F32, 2, 2),
        ("moe_experts", "kimi_linear", F16, 1, 3),
        ("moe_tail", "kimi_k3", F16, 3, 1),
        ("moe_tail", "deepseek_v3", F32, 1, 3),
    ],
)
def test_small_blocks_many_tiles(kind, config, dtype, B, T, monkeypatch):
    """16-wide blocks: several tiles per weight group, several K steps, ragged last chunks (MXFP4 latent
    22 = one full and one ragged step; expert width 20 = a full and a ragged 16-row chunk)."""
    monkeypatch.setattr(moe, "INTERPRET_BLOCKS", {"n": 16, "k": 16, "i": 16})
    assert check_kernel(kind, TINY_CONFIGS[config], moe.KERNELS[kind], dtype, B=B, T=T, seed=11) > 0


@pytest.mark.parametrize("kind", ["moe_front", "moe_experts"])
def test_many_experts_several_router_tiles(kind, monkeypatch):
    """36 experts in 16-wide router tiles: tiles 1 and 2 (ragged, 4 experts) compute logits 16..35 from
    their own router rows; the experts kernel routes over all 36."""
    monkeypatch.setattr(moe, "INTERPRET_BLOCKS", {"n": 16, "k": 16, "i": 16})
    assert check_kernel(kind, DEEPSEEK_MANY_EXPERTS, moe.KERNELS[kind], F32, B=2, T=3, seed=12) > 0


# ----------------------------------------------------------------------------- building blocks


@pytest.mark.parametrize("act", ["situ", "silu"])
def test_gated_activation_matches_torch(act):
    gen = torch.Generator().manual_seed(0)
    g = torch.cat([torch.randn(4000, generator=gen) * s for s in (1e-4, 0.05, 1.0, 6.0, 60.0)])
    u = torch.cat([torch.randn(4000, generator=gen) * s for s in (200.0, 1.0, 1e-3, 30.0, 0.3)])
    got = gated_activation(g, u, act, 4.0, 25.0)
    want = glu(g.double(), u.double(), act, 4.0, 25.0).float()
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-9)


def _moe_cfg(**kw) -> MoEConfig:
    base = dict(
        num_experts=8,
        top_k=3,
        intermediate_size=16,
        num_shared_experts=0,
        scoring="sigmoid",
        num_groups=1,
        topk_groups=1,
        renormalize=True,
        routed_scaling_factor=2.5,
    )
    return MoEConfig(**{**base, **kw})


@pytest.mark.parametrize(
    "cfg,rows",
    [
        (_moe_cfg(), 3),
        (_moe_cfg(num_experts=12, num_groups=4, topk_groups=2), 5),  # DeepSeek-style group limit
        (_moe_cfg(num_experts=10, num_groups=2, topk_groups=1, top_k=2, scoring="softmax", renormalize=False), 4),
        (_moe_cfg(num_experts=7, top_k=2, routed_scaling_factor=1.0), 16),
        (_moe_cfg(num_experts=896, top_k=16, routed_scaling_factor=1.0), 1),  # K3's router shape
    ],
)
def test_selection_matches_select_experts(cfg, rows):
    """Each slot's expert is the slot-th distinct selected id, with every row's weight for it."""
    gen = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, cfg.num_experts, generator=gen) * 2
    bias = torch.randn(cfg.num_experts, generator=gen) * 0.1
    weights, ids = select_experts(logits, bias, cfg)
    got_ids, got_p = route_slots(logits, bias, cfg)
    distinct = torch.unique(ids)
    assert got_ids[: len(distinct)].tolist() == distinct.tolist()
    assert (got_ids[len(distinct) :] == -1).all()
    want_p = torch.zeros(len(distinct), rows)
    for s, e in enumerate(distinct.tolist()):
        r, k = torch.nonzero(ids == e, as_tuple=True)
        want_p[s, r] = weights[r, k]
    torch.testing.assert_close(got_p[: len(distinct)], want_p, rtol=1e-6, atol=1e-7)


def test_experts_without_renormalisation_in_two_groups_match_twin():
    """DeepSeek-style routing with ``norm_topk_prob`` false (the selected weights are not divided by their sum)
    and exactly 2 expert groups (top-1 group: the group limit still applies at 2): the kernel must take both
    from the config (a launch hard-wiring renormalisation, or grouping only above 2 groups, routes and weights
    the rows differently from the twin)."""
    raw = dict(TINY_CONFIGS["deepseek_v3"], norm_topk_prob=False, n_group=2, topk_group=1)
    assert check_kernel("moe_experts", raw, moe.KERNELS["moe_experts"], F32, B=2, T=3, seed=12) > 0
