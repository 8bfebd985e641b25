"""``ops.gqa_attn_decode`` (the C++ attention kernel in a decode step) on sequences of different lengths: the
shorter one must see keys 0..its own position only, as the reference's causal mask says, although the step's
row table spans the longest one (its rows past that position hold stale or empty pool rows)."""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.runtime.cpu import CPUExecutor
from nonstop.runtime.cpu.kernels import load_kernels
from nonstop.runtime.cpu.ops import CPU_KERNEL_OPS
from tests.runtime.helpers import tiny_model

KERNELS_MISSING = load_kernels(progress=False)


@pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")
def test_decode_logits_of_sequences_at_different_positions_match_the_reference():
    model = tiny_model("llama")
    ex = CPUExecutor(model, compile=False, progress=False)
    assert ex.table is CPU_KERNEL_OPS
    caches = [ModelCache(model.cfg, 3, capacity=16, page_size=4) for _ in range(2)]
    prompts = {2: [5, 6, 7, 8, 9, 10, 11], 0: [12, 13, 14]}  # slot -> prompt: 7 and 3 tokens
    for cache in caches:
        for slot, prompt in prompts.items():
            batch = cache.batch([slot], len(prompt))
            model(torch.tensor([prompt]), cache, batch)
            cache.advance(batch)
    ids = torch.tensor([[40], [41]])
    got, want = [], []
    for cache, fn, out in ((caches[0], ex.forward, got), (caches[1], model.forward, want)):
        for _ in range(2):  # two decode steps of both sequences together
            batch = cache.batch([2, 0], 1)
            out.append(fn(ids, cache, batch, last_only=True))
            cache.advance(batch)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weights", ["bfloat16", "int8"])
def test_quantized_moe_decode_logits_match_the_reference_on_the_rounded_weights(weights):
    """The gathered routed experts (``ops.moe_experts_gathered``: int8 as Q and per-row scales) against the
    reference's expert loop on the weights packing left in the model: logits, not only greedy tokens, to fp32
    rounding (the stacks widen to fp32; bf16 expert math would be ~1e-5 off on this model's ~0.4 logits)."""
    model = tiny_model("kimi_k3")
    ex = CPUExecutor(model, weights=weights, compile=False, progress=False)
    caches = [ModelCache(model.cfg, 3, capacity=8, page_size=4) for _ in range(2)]
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    for cache in caches:
        batch = cache.batch([2, 0], 6)
        model(prompt, cache, batch)
        cache.advance(batch)
    ids = torch.tensor([[40], [41]])
    out = []
    for cache, fn in ((caches[0], ex.forward), (caches[1], model.forward)):
        batch = cache.batch([2, 0], 1)
        out.append(fn(ids, cache, batch, last_only=True))
        cache.advance(batch)
    torch.testing.assert_close(out[0], out[1], rtol=1e-5, atol=1e-6)
