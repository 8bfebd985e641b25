"""Gaps a mutation audit of ``runtime/launch_count.py`` found: host syncs of the operators that bring data to
the host (``nonzero``, ``.item()``, ``.tolist()``), what is not a sync (a tensor copied into a new tensor),
Triton launches with a callable grid, and Triton's ``run`` restored when a counter exits."""

from __future__ import annotations

import pytest
import torch

from nonstop.runtime.launch_count import LaunchCounter

triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@pytest.mark.parametrize(
    "read",
    [
        lambda x: torch.nonzero(x),
        lambda x: x.nonzero(),
        lambda x: x.sum().item(),
        lambda x: int(x[0]),
        lambda x: x.tolist(),
        lambda x: torch.tensor([1, 2]),
    ],
    ids=["torch.nonzero", "nonzero", "item", "int", "tolist", "tensor-from-list"],
)
def test_each_host_read_is_one_sync(read):
    x = torch.tensor([0.0, 1.0, 2.0])
    with LaunchCounter("cpu") as c:
        with c.tagged("op"):
            read(x)
    assert c.summary()["host_syncs"] == 1 and c.summary()["host_syncs_by_kind"] == {"op": 1}


def test_a_tensor_copied_from_a_tensor_is_not_a_sync():
    x = torch.arange(4)
    with LaunchCounter("cpu") as c:
        torch.as_tensor(x)
        x.clone()
    assert c.summary()["host_syncs"] == 0


def test_a_launch_with_a_callable_grid_is_one_launch():
    x = torch.zeros(40)
    with LaunchCounter("cpu") as c:
        _add_one[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, 40, BLOCK=16)
        _add_one[(0,)](x, 40, BLOCK=16)  # an empty grid launches nothing
    assert c.summary()["triton"] == 1 and c.triton == {"_add_one": 1}
    assert x.tolist() == [1.0] * 40


def test_a_counter_leaves_triton_as_it_found_it():
    """After a counter exits, launches are not counted by it (nor wrapped once more by every new counter)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    before = (JITFunction.run, InterpretedFunction.run)
    x = torch.zeros(16)
    with LaunchCounter("cpu") as first:
        _add_one[(1,)](x, 16, BLOCK=16)
    assert (JITFunction.run, InterpretedFunction.run) == before
    with LaunchCounter("cpu") as second:
        _add_one[(1,)](x, 16, BLOCK=16)
    _add_one[(1,)](x, 16, BLOCK=16)
    assert first.summary()["triton"] == 1 and second.summary()["triton"] == 1
