"""``kernel.prefetch_row`` on hand-made weights: which slice a task requests ahead of its body, at which
address and how many bytes. Expected values are computed by hand from the tensors' addresses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from nonstop.runtime.megakernel.kernel import PREFETCH_LINES, prefetch_row  # noqa: E402
from nonstop.runtime.megakernel.tasks import WeightSlice  # noqa: E402


def test_a_static_slice_along_a_later_dimension_is_skipped_for_the_next_row_slice():
    """Only whole tensors (dim -1) and row ranges (dim 0) are contiguous byte ranges: a static column slice
    (dim 1) must be skipped, not read as rows start..stop of the tensor (a wrong address range)."""
    w = torch.zeros(6, 10, dtype=torch.float16)
    bias = torch.zeros(7, dtype=torch.float32)
    op = SimpleNamespace(weights={"w": w, "bias": bias})
    cols = WeightSlice("w", 1, 2, 4, 6 * 2 * 2)
    rows = WeightSlice("w", 0, 1, 3, 2 * 10 * 2)
    assert prefetch_row(op, (cols,)) == (0, 0)
    assert prefetch_row(op, (cols, rows)) == (w.data_ptr() + 1 * 10 * 2, 2 * 10 * 2)
    whole = WeightSlice("bias", -1, 0, 7, 28)
    assert prefetch_row(op, (cols, whole, rows)) == (bias.data_ptr(), 7 * 4)


def test_a_row_slice_longer_than_the_prefetch_window_is_cut_to_it():
    """The request is at most PREFETCH_LINES lines of 128 bytes, starting at the slice's first row."""
    rows_per_window = PREFETCH_LINES * 128 // (64 * 4)
    w = torch.zeros(rows_per_window + 40, 64, dtype=torch.float32)
    op = SimpleNamespace(weights={"w": w})
    got = prefetch_row(op, (WeightSlice("w", 0, 5, rows_per_window + 30, 0),))
    assert got == (w.data_ptr() + 5 * 64 * 4, PREFETCH_LINES * 128)
