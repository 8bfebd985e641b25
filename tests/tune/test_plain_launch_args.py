"""A candidate's (or stored file's) kernels take tensors, numbers, strings, None, dtypes or tuples of them:
under TRITON_INTERPRET=1 a constexpr argument reaches the kernel body as the object itself, so a dict
launched there (``op.attrs``) was state the kernel could change in place and count its calls with."""

from __future__ import annotations

import types

import pytest
import torch
import triton
import triton.language as tl

from nonstop.runtime.tuned import plain_launch_args

SOURCE = """
import triton
import triton.language as tl


@triton.jit
def tick(state: tl.constexpr, n: tl.constexpr, out):
    state |= {"calls": n + 1}


@triton.jit
def fill(out, value, BLOCK: tl.constexpr, SHAPE: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, tl.full((BLOCK,), value, tl.float32) + SHAPE[0])
"""


def _module():
    module = types.ModuleType("nonstop_candidate_test")
    exec(compile(SOURCE, "<candidate>", "exec"), module.__dict__)  # noqa: S102 - the test's own source
    for obj in vars(module).values():
        if hasattr(obj, "fn"):
            obj.fn.__module__ = module.__name__
    return module


def test_a_dict_argument_is_refused_before_the_kernel_runs():
    module = _module()
    plain_launch_args(module)
    state = {}
    with pytest.raises(TypeError, match="kernel tick launched with a dict"):
        module.tick[(1,)](state, 0, torch.zeros(1))
    assert state == {}


@pytest.mark.parametrize("bad", [[1], {1}, object(), (1, [2])])
def test_containers_and_objects_are_refused_even_inside_tuples(bad):
    module = _module()
    plain_launch_args(module)
    with pytest.raises(TypeError, match="launched with"):
        module.fill[(1,)](torch.zeros(8), 1.0, 8, bad)


def test_tensors_numbers_dtypes_and_tuples_launch_as_before():
    module = _module()
    plain_launch_args(module)
    out = torch.full((8,), float("nan"))
    module.fill[(1,)](out, 2.0, BLOCK=8, SHAPE=(3, tl.float32, torch.bfloat16, None, "s"))
    assert torch.equal(out, torch.full((8,), 5.0))


def test_kernels_of_other_modules_are_left_alone():
    module = _module()

    @triton.jit
    def elsewhere(x: tl.constexpr):
        pass

    module.elsewhere = elsewhere
    plain_launch_args(module)
    assert "run" not in vars(elsewhere)
