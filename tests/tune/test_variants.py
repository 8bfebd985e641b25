"""Every variant of a kind that shares a tuned shape's store key (same weight shapes, other attributes) gets
a verification case of its own: the executor runs the stored winner on all of them."""

from __future__ import annotations

import random

import pytest
import torch

from nonstop.model.build import meta_model
from nonstop.program.lower import lower
from nonstop.tune.cases import variants
from nonstop.tune.verify import plan, verify
from tests.tune.helpers import tiny_target

# the built-in attnres_mix_norm, but x off by 2% in the ops that mix two or more blocks: only the later
# layers' variants (n_blocks >= 2 in the tiny K3) are wrong
LATE_LAYERS_WRONG = """
import triton
import triton.language as tl

from nonstop.kernels.attnres import attnres_mix_norm as builtin


@triton.jit
def _scale(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(x_ptr + offs, x * 1.02, mask=m)


def launch(op, env):
    builtin(op, env)
    if op.attrs["n_blocks"] >= 2:
        out = env.buf[op.writes[0]]
        _scale[(triton.cdiv(out.numel(), 256),)](out, out.numel(), BLOCK=256)
"""


def _variant_count(target) -> int:
    with torch.device("meta"):
        return len(variants(lower(meta_model(target.cfg)), target.kind))


@pytest.mark.parametrize("kind", ["attnres_mix_norm", "linear_residual"])
def test_every_variant_of_a_tuned_shape_gets_a_tuned_case(kind):
    target = tiny_target(kind, "kimi_k3")
    count = _variant_count(target)
    assert count > len({s.variant for s in target.shapes})  # some variants share a store key
    specs = plan(target, random.Random(0))
    assert {s.variant for s in specs if s.label == "tuned"} == set(range(count))


def test_a_kernel_wrong_only_in_later_variants_is_rejected_in_the_calls():
    target = tiny_target("attnres_mix_norm", "kimi_k3")
    verdict = verify(LATE_LAYERS_WRONG, target, timeout_s=240, seed=1)
    assert not verdict.accepted
    assert "variant 3" in verdict.reasons[0] and "differ from the twin" in verdict.reasons[0], verdict.reasons
