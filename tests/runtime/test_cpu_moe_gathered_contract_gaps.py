"""Gaps a mutation audit of ``runtime/cpu/ops.py`` found: ``moe_experts_gathered`` (the CPU step's routed
experts) keeps the ``moe_experts`` contract of the twin it replaces, ``moe_out += Σ_k p_k E_k(moe_in)``,
checked by the kernel harness (``tests/kernels/harness.py``): the accumulator starts from random values in
both copies, so an op that overwrites it instead of adding fails. In today's program ``moe_front`` zeroes
``moe_out`` first, which hides an overwrite from every end-to-end test."""

from __future__ import annotations

import pytest

from nonstop.runtime.cpu.ops import moe_experts_gathered
from nonstop.runtime.cpu.pack import _pack_experts
from tests.kernels.harness import check_kernel
from tests.tiny_configs import TINY_CONFIGS


def _gathered_fp32(op, env):
    """The CPU op on the stacks ``pack_program`` gives it at float32 (MXFP4 experts widened to fp32)."""
    if "dense_experts" not in op.attrs:
        op.attrs["dense_experts"] = _pack_experts(op.attrs["experts"], "float32")
    moe_experts_gathered(op, env)


@pytest.mark.parametrize("name", ["kimi_k3", "kimi_k3_mxfp4", "deepseek_v3"])
@pytest.mark.parametrize("B", [1, 3])
def test_gathered_experts_accumulate_into_moe_out_as_the_twin(name, B):
    """Rows of different cache lengths (and a fresh slot): the op's output equals the twin's ``moe_out``,
    added onto what the buffer held (a ``copy_`` in place of ``add_`` or a dropped routing weight fails)."""
    assert check_kernel("moe_experts", TINY_CONFIGS[name], _gathered_fp32, B=B) > 0
