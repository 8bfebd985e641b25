"""What packing for the cpu backend holds at its peak, and the check made against free memory before it.

Packing once built every packed weight, then copied all of them onto huge pages while the originals were
alive (twice the packed model at the peak), and the check counted one copy of the linear weights only:
not the routed experts' bf16 / int8 / widened-MXFP4 stacks. A model that passed the check could then be
killed for memory with no message.
"""

from __future__ import annotations

import pytest
import torch

import nonstop.runtime.cpu.executor as cpu_executor
import nonstop.runtime.cpu.pack as pack
from nonstop.program.lower import lower
from nonstop.program.preflight import PreflightError
from nonstop.runtime.cpu import CPUExecutor
from nonstop.runtime.cpu.kernels import load_kernels
from nonstop.runtime.cpu.pack import pack_program, packed_bytes, packing_peak_bytes
from tests.runtime.helpers import tiny_model

KERNELS_MISSING = load_kernels(progress=False)


def _expert_bytes_by_hand(cfg, fmt: str) -> int:
    """Routed-expert stacks from the config: per MoE layer E experts of w1, w3 [I, d] and w2 [d, I]; bf16 2
    bytes a weight, int8 1 byte plus one fp32 scale per row, fp32 reuses the loaded stacks."""
    moe, d = cfg.moe, cfg.moe.latent_size or cfg.hidden_size
    E, inter = moe.num_experts, moe.intermediate_size
    layers = sum(t == "moe" for t in cfg.mlp_types)
    per_layer = {
        "float32": 0,
        "bfloat16": 2 * 3 * E * inter * d,
        "int8": 3 * E * inter * d + 4 * E * (2 * inter + d),
    }[fmt]
    return layers * per_layer


def _largest_linear(program) -> int:
    return max(
        w.numel()
        for op in program.ops
        for role, w in op.weights.items()
        if role in pack.LINEAR_ROLES and isinstance(w, torch.Tensor) and w.dim() == 2
    )


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("name", ["deepseek_v3", "kimi_k3", "llama"])
def test_the_peak_counts_the_experts_a_batch_being_placed_and_one_weights_temporaries(name, fmt):
    model = tiny_model(name)
    program = lower(model)
    linear = packed_bytes(program, fmt)
    largest = _largest_linear(program)
    experts, converted = 0, largest
    if model.cfg.moe is not None:
        experts = _expert_bytes_by_hand(model.cfg, fmt)
        moe, d = model.cfg.moe, model.cfg.moe.latent_size or model.cfg.hidden_size
        if fmt != "float32":  # a whole [E, I, d] stack is converted at once
            converted = max(largest, moe.num_experts * moe.intermediate_size * d)
    per_weight = {"float32": 4, "bfloat16": 2, "int8": 1 + 4 / 128}[fmt]
    want = linear + experts + min(linear, pack.PLACE_BATCH) + largest * per_weight + converted * 16
    assert packing_peak_bytes(program, fmt) == int(want)
    assert packing_peak_bytes(program, fmt) > 2 * linear  # more than the one copy the check once counted


def test_mxfp4_experts_widen_to_fp32_in_every_format():
    """K3's MXFP4 experts are stacked as fp32 for the step (4 bytes a weight, 8x their packed size) whatever
    the linear weights' format; the same model with dense experts differs by exactly that."""
    mxfp4, dense = tiny_model("kimi_k3_mxfp4"), tiny_model("kimi_k3")
    moe, d = mxfp4.cfg.moe, mxfp4.cfg.moe.latent_size or mxfp4.cfg.hidden_size
    layers = sum(t == "moe" for t in mxfp4.cfg.mlp_types)
    stack = moe.num_experts * moe.intermediate_size * d
    widened = layers * 4 * 3 * stack
    for fmt in ("float32", "bfloat16", "int8"):
        difference = packing_peak_bytes(lower(mxfp4), fmt) - packing_peak_bytes(lower(dense), fmt)
        # widening converts a whole stack even at fp32 (dense fp32 experts convert nothing)
        largest = _largest_linear(lower(dense))
        temporaries = 16 * (max(largest, stack) - largest) if fmt == "float32" else 0
        assert difference == widened - _expert_bytes_by_hand(dense.cfg, fmt) + temporaries


@pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")
@pytest.mark.parametrize("fmt", ["float32", "int8"])
def test_the_room_check_asks_for_the_peak(monkeypatch, fmt):
    """One byte short of the peak: int8 refuses in one line, fp32 keeps torch products on the loaded weights;
    the peak itself is enough."""
    peak = packing_peak_bytes(lower(tiny_model("deepseek_v3")), fmt)
    monkeypatch.setattr(cpu_executor, "available_memory", lambda device: peak - 1)
    if fmt == "int8":
        with pytest.raises(PreflightError, match="int8 row tiles take .* to pack"):
            CPUExecutor(tiny_model("deepseek_v3"), weights=fmt, compile=False, progress=False)
    else:
        ex = CPUExecutor(tiny_model("deepseek_v3"), weights=fmt, compile=False, progress=False)
        assert "row tiles take" in ex.stats["kernels"]
    monkeypatch.setattr(cpu_executor, "available_memory", lambda device: peak)
    ex = CPUExecutor(tiny_model("deepseek_v3"), weights=fmt, compile=False, progress=False)
    assert ex.stats["kernels"] == "C++ GEMV kernels"


@pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8"])
def test_weights_placed_in_many_small_batches_compute_as_in_one(monkeypatch, fmt):
    """A batch of one weight each (every weight in its own huge-page allocation) against one batch for all:
    the same tiles, the same products, and no two weights sharing memory."""
    whole, batched = lower(tiny_model("llama")), lower(tiny_model("llama"))
    pack_program(whole, fmt, kernels=True)
    monkeypatch.setattr(pack, "PLACE_BATCH", 1)
    pack_program(batched, fmt, kernels=True)
    x = torch.randn(3, tiny_model("llama").cfg.hidden_size)
    seen = []
    for a, b in zip(whole.ops, batched.ops):
        for role, w in a.weights.items():
            if role not in pack.LINEAR_ROLES or not hasattr(w, "streamed"):
                continue
            v = b.weights[role]
            for field in w.streamed:
                assert torch.equal(getattr(w, field), getattr(v, field))
                seen.append(getattr(v, field))
            if w.shape[1] == x.shape[1]:
                assert torch.equal(w.linear(x), v.linear(x))
    spans = sorted((t.data_ptr(), t.data_ptr() + t.nbytes) for t in seen)
    assert len(spans) > 4
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # disjoint
