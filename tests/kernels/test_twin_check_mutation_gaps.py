"""Gaps a mutation audit of ``runtime/twin_check.py`` found: the harness must fail kernels that get an op's
contract wrong in ways the twins' own step state would hide. Each "kernel" here is the op's plain-torch twin
with one part of the contract broken (no Triton: fast): overwriting an accumulator, skipping the cache rows a
step appends, skipping the per-token KDA states a speculative step keeps."""

from __future__ import annotations

import pytest

from nonstop.program.reference import REFERENCE
from tests.kernels.harness import check_kernel
from tests.tiny_configs import TINY_CONFIGS


def test_the_twin_itself_passes():
    assert check_kernel("linear_residual", TINY_CONFIGS["llama"], REFERENCE["linear_residual"]) > 0
    assert check_kernel("gqa_qkv_rope", TINY_CONFIGS["llama"], REFERENCE["gqa_qkv_rope"]) > 0


def test_a_kernel_that_overwrites_its_accumulator_fails():
    """``h += o_proj(x)`` written as ``h = o_proj(x)``."""

    def overwrite(op, env):
        env.buf[op.writes[0]].zero_()
        REFERENCE[op.kind](op, env)

    with pytest.raises(AssertionError, match="-> h"):
        check_kernel("linear_residual", TINY_CONFIGS["llama"], overwrite)


def test_a_kernel_that_skips_the_cache_append_fails():
    """The Q/K/V projection returns Q but leaves the step's K/V rows of the paged cache unwritten."""

    def no_append(op, env):
        cache = env.cache.layers[op.attrs["cache_layer"]]
        cache.fit_pool()
        saved = {k: t.clone() for k, t in cache.tensors.items()}
        REFERENCE[op.kind](op, env)
        for k, t in cache.tensors.items():
            t.copy_(saved[k])

    with pytest.raises(AssertionError, match="state L0"):
        check_kernel("gqa_qkv_rope", TINY_CONFIGS["llama"], no_append)


def test_a_speculative_kda_step_that_skips_its_state_history_fails():
    """With keep_states the recurrent state after every token is kept for rollback: a kernel that writes only
    the final state fails (its history rows are compared, poisoned first)."""

    def no_history(op, env):  # the history tensor is made (zeros) but the step's rows are not written
        REFERENCE[op.kind](op, env)
        env.cache.layers[op.attrs["cache_layer"]].history_recurrent[env.batch.slots, : env.T] = 0.0

    assert check_kernel("kda_core", TINY_CONFIGS["kimi_linear"], REFERENCE["kda_core"], T=2, keep_states=True) > 0
    with pytest.raises(AssertionError, match="history_recurrent"):
        check_kernel("kda_core", TINY_CONFIGS["kimi_linear"], no_history, T=2, keep_states=True)
