"""``LaunchCounter`` tallies on a CPU (Triton interpreter): one Triton launch is exactly one launch (not also the
torch operators the interpreter issues to move its arguments), warm-ups are not launches, launches are
attributed to the tag in force (nested tags restore the outer one), PDL launches are counted, CPU-to-CPU copies
are not host syncs, and a counter for another device counts none of the CPU's operators."""

from __future__ import annotations

import pytest
import torch

from nonstop.runtime.launch_count import LaunchCounter

triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def _twice(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def test_one_triton_launch_is_one_launch_and_no_torch_operator():
    """The interpreter moves arguments with torch operators: they must not be counted (off by several), and
    the launch itself once (by hand: 1 launch, 0 torch operators)."""
    x = torch.ones(16)
    with LaunchCounter("cpu") as c:
        _twice[(1,)](x, 16, BLOCK=16)
    s = c.summary()
    assert (s["launches"], s["triton"], s["torch"], s["host_syncs"]) == (1, 1, 0, 0)
    assert s["torch_ops"] == {}
    assert x.tolist() == [2.0] * 16


def test_a_warmup_is_not_a_launch():
    """``kernel.warmup(...)`` compiles only: no launch, and the data is untouched."""
    x = torch.ones(16)
    with LaunchCounter("cpu") as c:
        _twice.warmup(x, 16, BLOCK=16, grid=(1,))
    assert c.summary()["launches"] == 0
    assert x.tolist() == [1.0] * 16


def test_triton_launches_are_attributed_to_the_tag_and_nested_tags_restore():
    """by_kind: launches inside ``tagged("a")`` go to "a", inside a nested ``tagged("b")`` to "b", and after
    the nested block again to "a"; after both, to None (counted by hand: a 2, b 1, None 1)."""
    x = torch.ones(16)
    with LaunchCounter("cpu") as c:
        with c.tagged("a"):
            _twice[(1,)](x, 16, BLOCK=16)
            with c.tagged("b"):
                _twice[(1,)](x, 16, BLOCK=16)
            _twice[(1,)](x, 16, BLOCK=16)
        _twice[(1,)](x, 16, BLOCK=16)
    assert dict(c.by_tag) == {"a": 2, "b": 1, None: 1}
    assert c.tag is None


def test_a_pdl_launch_is_counted_as_one():
    """``launch_pdl=True`` launches are counted in ``pdl_launches`` (one here), the plain one not."""
    x = torch.ones(16)
    with LaunchCounter("cpu") as c:
        _twice[(1,)](x, 16, BLOCK=16, launch_pdl=True)
        _twice[(1,)](x, 16, BLOCK=16)
    assert c.summary()["pdl_launches"] == 1 and c.summary()["triton"] == 2


def test_a_cpu_to_cpu_copy_is_not_a_host_sync():
    """On a CPU nothing waits for a device: a dtype conversion and a copy between CPU tensors are launches of
    the CPU, not host syncs."""
    x = torch.arange(4.0)
    y = torch.empty(4, dtype=torch.float64)
    with LaunchCounter("cpu") as c:
        x.to(torch.float64)
        y.copy_(x)
    s = c.summary()
    assert s["host_syncs"] == 0
    assert s["torch"] == 2


def test_a_counter_for_another_device_counts_no_cpu_operator():
    """A counter for "cuda" counts only what runs on a CUDA device: CPU arithmetic is 0 launches there."""
    x = torch.arange(4.0)
    with LaunchCounter("cuda") as c:
        x + 1
        x.mul(3)
    assert c.summary()["torch"] == 0


def test_a_counter_inside_another_in_one_thread_is_refused_not_a_hang():
    """The patch lock is not reentrant: a LaunchCounter entered inside another in the same thread waited on
    itself forever. It is refused with a RuntimeError, and the outer counter still works and releases."""
    with LaunchCounter(torch.device("cpu")) as outer:
        with pytest.raises(RuntimeError, match="already active in this thread"):
            with LaunchCounter(torch.device("cpu")):
                pass
        torch.ones(2).add_(1)
    assert outer.total >= 0
    with LaunchCounter(torch.device("cpu")):  # the lock was released: a later counter enters
        pass
