"""In-kernel expert selection (``nonstop/kernels/moe_routing.py``) at shapes and values the twin-checks miss.

The reference is written from the router algorithm (docs: model-architecture §5.1, "noaux_tc"), not from
``select_experts``: s = σ(l) or softmax(l); c = s + bias; groups keep the ``topk_group`` best top-2 sums of
c (an fp32 sum); top-k of c; weights = s at the picks, renormalised (+1e-20) and scaled. Ties go to the lower
id (the kernel's documented rule: a deterministic choice where torch.topk's order is unspecified).
"""

from __future__ import annotations

import pytest
import torch

from nonstop.config import MoEConfig
from tests.kernels.probes import route_slots
from tests.kernels.test_moe import _moe_cfg as _cfg


def _lowest_first_top(values: list[float], k: int) -> list[int]:
    """Indices of the k largest values, ties to the lower index."""
    return sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]


def _reference(logits: torch.Tensor, bias: torch.Tensor | None, cfg: MoEConfig) -> list[tuple[list[int], list[float]]]:
    """Per row: (chosen expert ids, their final weights), from the algorithm's definition."""
    out = []
    E, G = cfg.num_experts, cfg.num_groups
    EG = E // G
    for row in logits.float():  # fp32 scores, as the router computes them
        s = torch.softmax(row, 0) if cfg.scoring == "softmax" else torch.sigmoid(row)
        c = (s + (bias.float() if bias is not None else 0.0)).tolist()
        if G > 1:
            # the top-2 sum in fp32, as the router adds them (in float64 two groups tied in fp32 can differ)
            top2 = [sorted(c[g * EG : (g + 1) * EG], reverse=True)[:2] for g in range(G)]
            gscore = [
                float(torch.tensor(a, dtype=torch.float32) + torch.tensor(b, dtype=torch.float32)) for a, b in top2
            ]
            kept = set(_lowest_first_top(gscore, cfg.topk_groups))
            c = [v if e // EG in kept else float("-inf") for e, v in enumerate(c)]
        ids = _lowest_first_top(c, cfg.top_k)
        w = [float(s[e]) for e in ids]
        if cfg.renormalize:
            total = sum(w) + 1e-20
            w = [x / total for x in w]
        out.append((ids, [x * cfg.routed_scaling_factor for x in w]))
    return out


def _check(logits: torch.Tensor, bias: torch.Tensor | None, cfg: MoEConfig) -> None:
    rows = logits.shape[0]
    want = _reference(logits, bias, cfg)
    distinct = sorted({e for ids, _ in want for e in ids})
    want_p = torch.zeros(len(distinct), rows)
    for r, (ids, w) in enumerate(want):
        for e, x in zip(ids, w):
            want_p[distinct.index(e), r] = x
    got_ids, got_p = route_slots(logits, bias, cfg)
    assert got_ids[: len(distinct)].tolist() == distinct
    assert (got_ids[len(distinct) :] == -1).all()
    torch.testing.assert_close(got_p[: len(distinct)], want_p, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
def test_a_group_count_that_is_not_a_power_of_two(scoring):
    """12 experts in 3 groups: the group tile is padded to 4, and the padded group's columns (ids 12..15)
    must never be read or chosen."""
    cfg = _cfg(num_experts=12, num_groups=3, topk_groups=2, top_k=3, scoring=scoring)
    gen = torch.Generator().manual_seed(31)
    for _ in range(3):
        logits = torch.randn(5, 12, generator=gen) * 2
        bias = torch.randn(12, generator=gen) * 0.1
        # the rows sit inside a larger buffer whose next columns are huge: an unmasked read would pick them
        wide = torch.full((5, 16), 50.0)
        wide[:, :12] = logits
        _check(wide[:, :12], bias, cfg)


def test_saturated_scores_tie_to_the_lowest_expert_id():
    """σ(l) rounds to exactly 1.0 in fp32 for l > ~17, so several experts can tie; the lowest ids win."""
    cfg = _cfg(num_experts=10, top_k=3, routed_scaling_factor=1.0)
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 10, generator=gen)
    hot = [[1, 4, 6, 9], [0, 2, 3, 8], [5, 6, 7, 8], [2, 9, 4, 7]]
    for r, cols in enumerate(hot):
        logits[r, cols] = 25.0 + torch.rand(len(cols), generator=gen)
    assert torch.sigmoid(logits).eq(1.0).sum() == 16  # real ties
    _check(logits, None, cfg)


def test_tied_groups_keep_the_lowest_group_ids():
    """Equal logits: every group scores the same; the kept groups and then the picks are the lowest ids."""
    cfg = _cfg(num_experts=12, num_groups=4, topk_groups=2, top_k=4, routed_scaling_factor=1.0)
    logits = torch.full((3, 12), 0.75)
    _check(logits, torch.zeros(12), cfg)


def test_softmax_scores_of_large_logits():
    """softmax must subtract the row max: e^l overflows fp32 past l ≈ 88 (a router with large logits)."""
    cfg = _cfg(num_experts=9, top_k=2, scoring="softmax", renormalize=False, routed_scaling_factor=1.0)
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(3, 9, generator=gen) * 3 + torch.tensor([[95.0], [-120.0], [0.0]])
    _check(logits, None, cfg)


@pytest.mark.parametrize("groups", [1, 4])
def test_the_twin_breaks_ties_as_the_kernel_does(groups):
    """``select_experts`` (the reference, CPU and distributed routing) picks the same experts, in the same
    order, as the kernel on saturated and exactly equal scores: a tie must not send a token to different
    experts on different backends."""
    from nonstop.model.moe import select_experts

    cfg = _cfg(num_experts=12, num_groups=groups, topk_groups=min(2, groups), top_k=4, routed_scaling_factor=1.0)
    gen = torch.Generator().manual_seed(17)
    logits = torch.randn(4, 12, generator=gen)
    logits[0, [1, 4, 6, 9, 10]] = 30.0
    logits[1] = 0.5
    logits[2, [0, 3, 7, 11]] = 26.0 + torch.rand(4, generator=gen)
    logits[3, [2, 5, 8]] = 40.0
    bias = torch.zeros(12)
    weights, ids = select_experts(logits, bias, cfg)
    for r, (want_ids, want_w) in enumerate(_reference(logits, bias, cfg)):
        assert ids[r].tolist() == want_ids
        torch.testing.assert_close(weights[r], torch.tensor(want_w), rtol=1e-6, atol=1e-7)


def test_groups_tied_only_in_fp32_keep_the_lowest_group():
    """Row 1: group 0's top-2 is s+u, s and group 1's s+u, s+u (u = 2^-24, one ulp of s ≈ 0.69); in fp32 both
    sums round to the same value (a half-ulp tie rounds to even), so the groups tie and group 0 wins; a float64
    sum would keep group 1 (experts 3 and 5)."""
    hi, lo = 0.8212022185325623, 0.38419434428215027
    logits = torch.tensor(
        [
            [-1.4159868955612183, -1.4159868955612183, 0.7355029582977295] * 3,
            [hi, hi, hi, hi, hi, hi, lo, hi, hi],
            [0.05989212170243263, 1.3143653869628906, 1.3143653869628906] * 3,
        ]
    )
    u = 2.0**-24
    bias = torch.tensor([0.0, 0.0, u, u, 0.0, u, 0.0, u, 0.0])
    s = torch.sigmoid(logits[1])
    assert float((s[2] + bias[2]) + s[0]) == float((s[3] + bias[3]) + (s[5] + bias[5]))  # the fp32 tie is real
    _check(logits, bias, _cfg(num_experts=9, num_groups=3, topk_groups=1, top_k=2, renormalize=False))


@pytest.mark.parametrize(
    "E, G, TG, k, scoring",
    [
        (7, 1, 1, 3, "sigmoid"),
        (9, 3, 2, 3, "softmax"),
        (15, 5, 2, 4, "sigmoid"),
        (12, 4, 3, 5, "softmax"),
        (10, 5, 4, 1, "sigmoid"),
    ],
)
def test_exact_ties_and_one_ulp_bias_near_ties_at_odd_shapes(E, G, TG, k, scoring):
    """Rows of two distinct logits (exact ties: equal logits give equal scores on every backend) and a bias of
    0-2 fp32 ulps (near-ties: s + bias is one IEEE add, so the reference and the kernel see the same numbers)."""
    gen = torch.Generator().manual_seed(E * 100 + k)
    R = 3
    vals = torch.randn(R, 2, generator=gen)
    logits = torch.gather(vals, 1, torch.randint(0, 2, (R, E), generator=gen))
    bias = torch.randint(0, 3, (E,), generator=gen).float() * 2.0**-24
    # k = 1 with renormalisation is left out: the reference (§5.1 step 6) renormalises only for k > 1, the
    # kernel and select_experts for every k (transformers' and vLLM's choice); no shipped config has k = 1
    shape = dict(num_experts=E, num_groups=G, topk_groups=TG, top_k=k, scoring=scoring)
    _check(logits, bias, _cfg(**shape, renormalize=k > 1, routed_scaling_factor=2.446))
    _check(logits, None, _cfg(**shape, renormalize=False, routed_scaling_factor=1.0))
