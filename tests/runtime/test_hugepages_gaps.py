"""``runtime/cpu/hugepages.py`` beyond the packing test: a large ``hugepage_empty`` is a whole, writable tensor
starting on a 2 MiB boundary, the huge pages inside it (and nothing before it) are advised, ``hugepage_copies``
honours its ``align`` and an empty list, and the elements' size (not their count) sizes the allocation."""

from __future__ import annotations

import sys

import pytest
import torch

from nonstop.runtime.cpu import hugepages
from nonstop.runtime.cpu.hugepages import HUGE_PAGE, hugepage_copies, hugepage_empty

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge pages are advised on Linux only")


@linux
def test_a_large_allocation_is_aligned_whole_and_advised_from_its_start(monkeypatch):
    """3 MiB + 12 bytes of fp32: one 2 MiB page lies wholly inside it and is advised, starting at the tensor's
    first byte; every element can be written and read back."""
    advised = []
    monkeypatch.setattr(hugepages, "_madvise_huge", lambda address, length: advised.append((address, length)))
    numel = (3 << 20) // 4 + 3
    t = hugepage_empty(numel, torch.float32)
    assert t.shape == (numel,) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % HUGE_PAGE == 0
    assert advised == [(t.data_ptr(), HUGE_PAGE)]
    t.copy_(torch.arange(numel, dtype=torch.float32))
    assert t[-1].item() == numel - 1 and t[0].item() == 0
    assert t.untyped_storage().nbytes() >= numel * 4 + (t.data_ptr() - t.untyped_storage().data_ptr())


def test_a_small_allocation_is_a_plain_tensor(monkeypatch):
    """Under one huge page (bytes, not elements: 2^19 fp32 values = exactly 2 MiB is large, 2^19 - 1 is not)
    nothing is advised."""
    advised = []
    monkeypatch.setattr(hugepages, "_madvise_huge", lambda address, length: advised.append(length))
    small = hugepage_empty((HUGE_PAGE // 4) - 1, torch.float32)
    assert small.shape == ((HUGE_PAGE // 4) - 1,) and advised == []
    if sys.platform.startswith("linux"):
        big = hugepage_empty(HUGE_PAGE // 4, torch.float32)
        assert big.data_ptr() % HUGE_PAGE == 0 and advised == [HUGE_PAGE]


def test_copies_honour_the_asked_alignment_and_an_empty_list():
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(3, generator=g), torch.randn(2, 5, generator=g).bfloat16(), torch.randn(7, generator=g)]
    copies = hugepage_copies(tensors, align=256)
    for t, c in zip(tensors, copies):
        assert torch.equal(t, c) and c.shape == t.shape and c.dtype == t.dtype
    base = copies[0].data_ptr()
    assert [c.data_ptr() - base for c in copies] == [0, 256, 512]  # 12 bytes, then 20 bytes: each padded to 256
    assert hugepage_copies([]) == []
