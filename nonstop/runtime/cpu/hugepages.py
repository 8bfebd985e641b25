"""Weight memory on transparent huge pages (Linux): ``hugepage_empty(numel, dtype)`` and
``hugepage_copies(tensors)`` (many tensors side by side in one such allocation).

A decode step streams every weight once. On 4 KiB pages the stream crosses a page every 4 KiB: the
hardware prefetchers stop at each boundary and each new page costs a TLB walk, so a one-row product
reads its weight well below the memory's bandwidth (bench/cpu_gemv.py measures both). Memory advised
with ``madvise(MADV_HUGEPAGE)`` before it is first written is faulted in as 2 MiB pages where the
kernel allows it (``/sys/kernel/mm/transparent_hugepage/enabled`` = always or madvise). Small weights
(k3-nano's are all under 2 MiB) gain only when they share huge pages: ``hugepage_copies``. Elsewhere, or
under one huge page in all, this is ``torch.empty``.
"""

from __future__ import annotations

import ctypes
import sys

import torch

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux

_libc = None


def _madvise_huge(address: int, length: int) -> bool:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return _libc.madvise(address, length, MADV_HUGEPAGE) == 0


def release_free_memory() -> None:
    """Hand the heap's free pages back to the system (glibc ``malloc_trim``; elsewhere nothing): after
    packing, the temporaries' pages would otherwise stay in the process's resident memory."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except AttributeError:  # a C library without it (musl)
        pass


def hugepage_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised 1-D CPU tensor of ``numel`` elements starting on a huge-page boundary, its pages
    advised as huge before anything touches them (a view into a slightly larger allocation)."""
    nbytes = numel * dtype.itemsize
    if not sys.platform.startswith("linux") or nbytes < HUGE_PAGE:
        return torch.empty(numel, dtype=dtype)
    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)  # untouched: pages are faulted in on first write
    offset = -raw.data_ptr() % HUGE_PAGE
    whole = (nbytes // HUGE_PAGE) * HUGE_PAGE
    _madvise_huge(raw.data_ptr() + offset, whole)
    return raw[offset : offset + nbytes].view(dtype)


def hugepage_copies(tensors: list[torch.Tensor], align: int = 64) -> list[torch.Tensor]:
    """Contiguous copies of ``tensors`` (any dtypes), in order, each at an ``align``-byte boundary of one
    ``hugepage_empty`` allocation: [copy of tensors[0], copy of tensors[1], ...] with their shapes."""
    offsets, total = [], 0
    for t in tensors:
        total = -(-total // align) * align
        offsets.append(total)
        total += t.numel() * t.element_size()
    arena = hugepage_empty(total, torch.uint8)
    copies = []
    for t, start in zip(tensors, offsets):
        view = arena[start : start + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        view.copy_(t)
        copies.append(view)
    return copies
