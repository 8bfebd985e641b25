"""A stored kernel must not take a tensor for a ``tl.constexpr`` parameter: under TRITON_INTERPRET=1 the body
gets the tensor itself and could compute on it with torch, unrecorded. The refusal must hold whether the tensor
is passed by position or by name, alone or inside a tuple, and a tensor for a plain parameter still launches."""

from __future__ import annotations

import types

import pytest
import torch

from nonstop.runtime.tuned import plain_launch_args

triton = pytest.importorskip("triton")

SOURCE = """
import triton
import triton.language as tl


@triton.jit
def scale(out, x, FACTOR: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs) * FACTOR)
"""


def _module():
    module = types.ModuleType("nonstop_constexpr_gap")
    exec(compile(SOURCE, "<stored kernel>", "exec"), module.__dict__)  # noqa: S102 - the test's own source
    module.scale.fn.__module__ = module.__name__
    plain_launch_args(module)
    return module


@pytest.mark.parametrize(
    "call",
    [
        lambda m, out, x, t: m.scale[(1,)](out, x, t, 4),
        lambda m, out, x, t: m.scale[(1,)](out, x, FACTOR=t, BLOCK=4),
        lambda m, out, x, t: m.scale[(1,)](out, x, (t,), 4),
    ],
    ids=["positional", "keyword", "in-a-tuple"],
)
def test_a_tensor_for_a_constexpr_is_refused(call):
    """Catches losing the constexpr annotation check or the positional binding of arguments to names."""
    m = _module()
    out, x = torch.zeros(4), torch.arange(4.0)
    with pytest.raises(TypeError, match="tensor for its constexpr parameter FACTOR"):
        call(m, out, x, torch.tensor(2.0))
    assert out.tolist() == [0.0] * 4


def test_tensors_for_plain_parameters_and_numbers_for_constexprs_launch():
    """The refusal is only for constexpr parameters: the usual launch computes x * 2 (by hand: 0, 2, 4, 6)."""
    m = _module()
    out, x = torch.zeros(4), torch.arange(4.0)
    m.scale[(1,)](out, x, 2, 4)
    assert out.tolist() == [0.0, 2.0, 4.0, 6.0]
