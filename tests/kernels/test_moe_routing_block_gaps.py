"""In-kernel expert selection (``nonstop/kernels/moe_routing.py``) where the padded tiles matter: group counts
and group widths that are not powers of two (padding groups and padding columns), negative correction
biases (a padded column whose score is 0 would then beat every real one), ties at the top of a group, and
logits rows that sit inside a wider buffer (a row stride that is not E).

The expected choices come from ``_reference`` of ``test_routing_mutation_gaps`` (the router algorithm
written as plain Python loops, not ``select_experts``).
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_moe import _moe_cfg as _cfg
from tests.kernels.test_routing_mutation_gaps import _check

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")


def _in_wide_buffer(logits: torch.Tensor, fill: float = 60.0) -> torch.Tensor:
    """The rows as a view into a buffer 5 columns wider, whose extra columns are huge (a read past E or
    with the wrong row stride would pick them)."""
    rows, e = logits.shape
    wide = torch.full((rows, e + 5), fill)
    wide[:, :e] = logits
    return wide[:, :e]


@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
def test_padded_group_never_outranks_real_groups_under_negative_bias(scoring):
    """12 experts in 3 groups (group tile padded to 4) and a correction bias of -3: every real group's top-2
    sum is below -4, so a padding group scored 0 instead of -inf would take one of the 2 kept group places
    and the row would choose from one group instead of two."""
    cfg = _cfg(num_experts=12, num_groups=3, topk_groups=2, top_k=4, scoring=scoring)
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 12, generator=gen) * 2
    bias = torch.full((12,), -3.0) + torch.randn(12, generator=gen) * 0.05
    _check(_in_wide_buffer(logits), bias, cfg)


def test_padding_columns_of_a_group_do_not_score_under_negative_bias():
    """15 experts in 3 groups of 5 (each group padded to 8 columns), bias -2: a padding column scored 0 (not
    -inf) would be every group's top-1, turning the group score into (0 + best real) and keeping the groups
    with the best single expert rather than the best pair."""
    cfg = _cfg(num_experts=15, num_groups=3, topk_groups=1, top_k=2)
    # group 0: one very good expert and poor ones; group 1: two good ones (best pair); group 2: mediocre
    logits = torch.tensor(
        [
            [4.0, -4.0, -4.0, -4.0, -4.0, 2.0, 2.0, -4.0, -4.0, -4.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [-4.0, -4.0, -4.0, -4.0, 3.0, 1.5, -4.0, -4.0, 1.5, -4.0, 0.5, 0.2, 0.1, 0.0, 0.3],
        ]
    )
    _check(_in_wide_buffer(logits), torch.full((15,), -2.0), cfg)


def test_a_group_whose_top_two_experts_tie():
    """Group scores are the sum of the top TWO choice scores, ties included: group 0 holds two saturated
    experts (σ = 1.0 exactly, sum 2.0) and group 1 two at ≈ 0.95 (sum ≈ 1.90). Dropping every copy of the
    maximum (not just one) would score group 0 as 1.0 + 0.05 and keep group 1 instead."""
    cfg = _cfg(num_experts=8, num_groups=2, topk_groups=1, top_k=2, routed_scaling_factor=1.0)
    logits = torch.tensor(
        [
            [30.0, 31.0, -3.0, -3.0, 3.0, 2.9, -1.0, -2.0],
            [-3.0, -2.0, 2.95, 2.9, 40.0, -1.0, 35.0, -3.0],
        ]
    )
    assert torch.sigmoid(logits[0, :2]).eq(1.0).all() and torch.sigmoid(logits[1, [4, 6]]).eq(1.0).all()
    _check(logits, torch.zeros(8), cfg)


def test_logits_rows_with_a_row_stride_larger_than_the_expert_count():
    """Ungrouped sigmoid routing of 7 experts from rows of a wider buffer (row stride 12): each row must be
    read at r·stride, not r·E (which would mix the next row's logits and the huge padding in)."""
    cfg = _cfg(num_experts=7, top_k=2)
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(5, 7, generator=gen) * 2
    _check(_in_wide_buffer(logits), torch.randn(7, generator=gen) * 0.1, cfg)
