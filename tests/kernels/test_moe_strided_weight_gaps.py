"""Routed-expert weights that are views with padded rows (``launch_moe_experts`` passes each tensor's own
expert and row strides; ``require_unit_columns`` only requires unit column strides): the kernel must index expert e,
row n at e·stride(0) + n·stride(1), not at the contiguous e·N·K + n·K. The twin computes from the model's
own contiguous parameters, so a kernel that assumed contiguity reads shifted, partly padding rows.
"""

from __future__ import annotations

import pytest
import torch

import tests.kernels.harness as harness
from nonstop.kernels import moe
from tests.kernels.harness import check_kernel
from tests.tiny_configs import DEEPSEEK, KIMI_K3_MXFP4

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

_TC = KIMI_K3_MXFP4["text_config"]
_K3_MXFP4_ONE_LAYER = {
    **KIMI_K3_MXFP4,
    "text_config": {
        **_TC,
        "num_hidden_layers": 2,
        "linear_attn_config": {**_TC["linear_attn_config"], "full_attn_layers": [2], "kda_layers": [1]},
    },
}
_EXPERT_ROLES = ("w1", "w3", "w2", "w1_packed", "w3_packed", "w2_packed", "w1_scale", "w3_scale", "w2_scale")


def _padded_view(t: torch.Tensor) -> torch.Tensor:
    """The same values as a view into a larger buffer: 2 more rows and 3 more columns per expert (junk in
    the padding), so stride(0) and stride(1) both differ from the contiguous ones."""
    e, n, k = t.shape
    big = torch.full((e, n + 2, k + 3), 7, dtype=t.dtype)
    view = big[:, 1 : n + 1, :k]
    view.copy_(t)
    return view


def _lower_with_padded_expert_weights(model):
    program = _original_lower(model)
    for op in program.ops:
        if op.kind == "moe_experts":
            for role in _EXPERT_ROLES:
                if role in op.weights:
                    op.weights[role] = _padded_view(op.weights[role])
                    assert not op.weights[role].is_contiguous()
    return program


_original_lower = harness.lower


@pytest.mark.parametrize("raw", [{**DEEPSEEK, "num_hidden_layers": 2}, _K3_MXFP4_ONE_LAYER], ids=["dense", "mxfp4"])
def test_experts_honour_the_strides_of_padded_weight_views(raw, monkeypatch):
    """Dense w1/w3/w2 and MXFP4 packed bytes and scales as padded views: wrong expert or row strides (or
    the scales' strides) would route every expert but the first through the wrong rows."""
    monkeypatch.setattr(harness, "lower", _lower_with_padded_expert_weights)
    assert check_kernel("moe_experts", raw, moe.KERNELS["moe_experts"], torch.float32, B=2, T=2, seed=24) == 1


def _lower_with_transposed_router(model):
    program = _original_lower(model)
    for op in program.ops:
        if op.kind == "moe_front":
            r = op.weights["router"]
            op.weights["router"] = r.t().contiguous().t()  # same values, column stride E
    return program


def test_front_rejects_a_weight_without_unit_column_stride(monkeypatch):
    """A router stored column-major (stride(-1) != 1) is read by the kernel as rows of unit stride: the launch
    must refuse it ("unit column stride") rather than compute logits from transposed memory."""
    monkeypatch.setattr(harness, "lower", _lower_with_transposed_router)
    with pytest.raises(ValueError, match="moe_front: router needs unit column strides"):
        check_kernel("moe_front", {**DEEPSEEK, "num_hidden_layers": 2}, moe.KERNELS["moe_front"], torch.float32)


def _padded_rows(t: torch.Tensor) -> torch.Tensor:
    """The same [N, K] values as a view whose rows are 3 elements longer (junk in the padding)."""
    n, k = t.shape
    big = torch.full((n, k + 3), 7, dtype=t.dtype)
    view = big[:, :k]
    view.copy_(t)
    return view


@pytest.mark.parametrize("kind,role", [("moe_front", "router"), ("moe_tail", "shared_down")])
def test_front_and_tail_refuse_weights_with_padded_rows(kind, role, monkeypatch):
    """The front and tail kernels take no row stride for their weights: a row-padded view (a column shard of
    a wider weight) passed the unit-column-stride check and was read as contiguous rows, logits off by 22
    and the output by 0.3 with no error. It is now refused, naming the weight."""

    def lower(model):
        program = _original_lower(model)
        for op in program.ops:
            if op.kind == kind:
                op.weights[role] = _padded_rows(op.weights[role])
        return program

    monkeypatch.setattr(harness, "lower", lower)
    with pytest.raises(ValueError, match=f"{kind}: weight '{role}' must be contiguous"):
        check_kernel(kind, {**DEEPSEEK, "num_hidden_layers": 2}, moe.KERNELS[kind], torch.float32)
