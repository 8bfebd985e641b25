"""Gaps a mutation audit of ``runtime/twin_check.py`` found: the kernel's copy of the step state must reach the
kernel with what it has to write poisoned (NaN), so a kernel that leaves any of it unwritten fails even where
the stale values happen to match: the step's rows of the paged cache an appending op writes. The "kernel"
here records what it was handed, then runs the twin (no Triton: fast)."""

from __future__ import annotations

from nonstop.program.reference import REFERENCE
from nonstop.runtime.twin_check import step_cache_rows
from tests.kernels.harness import check_kernel
from tests.tiny_configs import TINY_CONFIGS


def test_the_cache_rows_an_appending_op_writes_reach_the_kernel_poisoned():
    """The step's K/V rows of ``gqa_qkv_rope`` are NaN when its kernel starts."""
    seen = []

    def recording(op, env):
        seen.append({k: bool(t.isnan().all()) for k, t in step_cache_rows(op, env).items()})
        REFERENCE[op.kind](op, env)

    assert check_kernel("gqa_qkv_rope", TINY_CONFIGS["llama"], recording) > 0
    assert seen and all(all(rows.values()) and set(rows) == {"k", "v"} for rows in seen)
