"""The superop executor gives the reference's greedy tokens: with the plain-torch twins on every tiny
family config and on the bundled k3-nano, and with the Triton kernels (the interpreter on a CPU) on
every tiny config (a kind without a kernel fails; only a missing Triton skips).
Decoding runs batched (3 → 2 → 1 rows as requests finish), with short prompts prefilled through the
program (T > 1 rows) and a long one through the reference."""

from __future__ import annotations

import pytest

from nonstop.runtime.executors import ReferenceExecutor
from nonstop.runtime.superop import SuperOpExecutor
from tests.runtime.helpers import (
    MAX_TOKENS_SHORT,
    PROMPTS,
    greedy_tokens,
    kernel_skip_reason,
    skip_unless_kernels,
    tiny_model,
)
from tests.tiny_configs import TINY_CONFIGS


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_twins_give_the_reference_tokens(name):
    model = tiny_model(name)
    ex = SuperOpExecutor(model, use_kernels=False)
    assert greedy_tokens(model, ex) == greedy_tokens(model, ReferenceExecutor(model))
    assert ex.stats["program_steps"] > 0 and len(ex._steps) >= 3


def test_twins_give_the_reference_tokens_on_k3_nano():
    from nonstop.engine.llm import LLM
    from nonstop.engine.sampling import SamplingParams

    prompts = ["The curses library", "def main():\n    "]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    ref = LLM("k3-nano", dtype="float32")
    want = [o.token_ids for o in ref.generate(prompts, params)]
    ref.executor = SuperOpExecutor(ref.model, use_kernels=False)
    assert [o.token_ids for o in ref.generate(prompts, params)] == want


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_kernels_give_the_reference_tokens(name):
    model = tiny_model(name)
    skip_unless_kernels(model)
    ex = SuperOpExecutor(model)
    assert greedy_tokens(model, ex, PROMPTS, MAX_TOKENS_SHORT) == greedy_tokens(
        model, ReferenceExecutor(model), PROMPTS, MAX_TOKENS_SHORT
    )
    launches = ex.stats["launches"]
    assert all(s["launches"] >= len(ex.program.ops) for s in launches.values())


@pytest.mark.parametrize("name", ["llama", "kimi_k3"])
def test_kernel_steps_are_capturable(name):
    """A CUDA graph cannot hold a host synchronisation: the kernel path must not sync (per op kind)."""
    model = tiny_model(name)
    skip_unless_kernels(model)
    ex = SuperOpExecutor(model)
    greedy_tokens(model, ex, prompts=[[3, 4], [5]], max_tokens=[2, 2])
    syncs = {shape: s["host_syncs_by_kind"] for shape, s in ex.stats["launches"].items() if s["host_syncs"]}
    assert not syncs, f"kernel launch functions sync with the host (not capturable in a CUDA graph): {syncs}"


@pytest.mark.parametrize("name", ["llama", "k3"])
def test_llm_superop_backend_end_to_end(name, tmp_path):
    """``LLM(..., backend="superop")``: the reference's tokens once every kernel exists; until then the
    clear error naming the missing kinds."""
    from nonstop.engine.llm import LLM
    from nonstop.engine.sampling import SamplingParams
    from tests.engine.tiny_models import synth_checkpoint

    path = synth_checkpoint(name, tmp_path / name)
    ref = LLM(path, dtype="float32")
    reason = kernel_skip_reason(ref.model)
    if reason:
        with pytest.raises(ValueError, match="no Triton kernel yet for"):
            LLM(path, dtype="float32", backend="superop")
        pytest.skip(reason)
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    want = [o.token_ids for o in ref.generate(["ab", "hello"], params)]
    llm = LLM(path, dtype="float32", backend="superop")
    assert [o.token_ids for o in llm.generate(["ab", "hello"], params)] == want
    assert llm.executor.stats["program_steps"] > 0
