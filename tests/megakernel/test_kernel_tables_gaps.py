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


def test_a_refresh_that_regroups_task_classes_builds_a_new_kernel(monkeypatch):
    """The task table holds each task's class (opcode) and instance: a refresh whose re-recorded launches tile
    alike but fall into other classes (a constant that changed for some instances only splits a class and
    renumbers the rest) must say False - a new kernel and table - not keep the old opcodes under new source.
    An unchanged plan refreshes in place."""
    import dataclasses

    import nonstop.runtime.megakernel.kernel as kernel
    from nonstop.runtime.superop import ExecEnv
    from tests.megakernel.kernel_steps import kernel_step

    ks = kernel_step("kimi_linear", B=2, T=1)
    ex = ks.executor
    step = ex.static_step(2, 1)
    env = ExecEnv(step.buf, ks.steps.cache, step.batch)
    mk = kernel.StepKernel(ex.program, ks.ops, ex.impl, env, "cpu")
    assert mk.refresh(env)  # the same launches: refreshed in place
    real = kernel.build_plan
    first, second = sorted({r.opcode for runs in mk.plan.stages for r in runs})[:2]

    def swapped(*args, **kw):  # the same stages and tiles, two classes numbered the other way round
        plan = real(*args, **kw)
        swap = {first: second, second: first}
        stages = [[dataclasses.replace(r, opcode=swap.get(r.opcode, r.opcode)) for r in runs] for runs in plan.stages]
        return dataclasses.replace(plan, stages=stages)

    monkeypatch.setattr(kernel, "build_plan", swapped)
    assert not mk.refresh(env)
