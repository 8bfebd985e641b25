"""Packing for the ``cpu`` executor (``runtime/cpu/pack.py``, ``packed.py``): what a quantized format does to
the routed experts the model and the gathered step share, which weights get packed, the int8 group reaching
the packed weights, the size estimate of the packed copy, and the torch fallback of an fp32 weight. Values
from the formats' definitions (bf16 rounding, s·Q), not from the packing code."""

from __future__ import annotations

import pytest
import torch

from nonstop.program.lower import lower
from nonstop.runtime.cpu import CPUExecutor
from nonstop.runtime.cpu.pack import bytes_per_weight, packed_bytes
from nonstop.runtime.cpu.packed import Bf16Weight, F32Weight, Int8Weight
from tests.runtime.helpers import tiny_model


def test_fp32_weight_without_kernels_multiplies_the_loaded_values():
    g = torch.Generator().manual_seed(11)
    w, x, b = torch.randn(7, 33, generator=g), torch.randn(3, 33, generator=g), torch.randn(7, generator=g)
    want = (x.double() @ w.double().t() + b.double()).float()
    torch.testing.assert_close(F32Weight(w, kernels=False).linear(x, b), want, rtol=1e-6, atol=1e-5)
    want16 = (x.double() @ w.bfloat16().double().t() + b.double()).float()
    torch.testing.assert_close(Bf16Weight(w, kernels=False).linear(x, b), want16, rtol=1e-6, atol=1e-5)


def test_int8_packed_size_counts_one_scale_per_group():
    assert bytes_per_weight("float32") == 4.0 and bytes_per_weight("bfloat16") == 2.0
    assert bytes_per_weight("int8") == 1.0 + 4 / 128 and bytes_per_weight("int8", 32) == 1.125
    program = lower(tiny_model("llama"))
    weights = packed_bytes(program, "float32") / 4
    assert packed_bytes(program, "int8") == int(weights * (1 + 4 / 128))


def _experts(ex):
    return [op.attrs for op in ex.program.ops if op.kind == "moe_experts"]


@pytest.mark.parametrize("weights", ["bfloat16", "int8"])
def test_routed_experts_of_the_model_hold_the_values_the_step_gathers(weights):
    """The decode step gathers the packed expert stacks; prefill runs the model: both must use the same,
    rounded, expert weights (bf16: w == bf16(w); int8: w == s·Q of the stack)."""
    model = tiny_model("kimi_k3")
    originals = [
        {n: getattr(a["experts"], n).detach().clone() for n in ("w1", "w3", "w2")}
        for a in _experts(CPUExecutor(tiny_model("kimi_k3"), weights="float32", compile=False, progress=False))
    ]
    ex = CPUExecutor(model, weights=weights, compile=False, progress=False)
    attrs = _experts(ex)
    assert attrs and len(attrs) == len(originals)
    for a, before in zip(attrs, originals):
        for name in ("w1", "w3", "w2"):
            w = getattr(a["experts"], name).detach()
            stack = a["dense_experts"][name]
            if weights == "bfloat16":
                assert torch.equal(w, before[name].bfloat16().float()) and torch.equal(stack.float(), w)
            else:
                q, s = stack
                assert torch.equal(w, q.float() * s) and not torch.equal(w, before[name])


def test_every_linear_weight_is_packed_but_router_embedding_and_conv():
    """pack.py: all weights a super-op multiplies with ``linear`` are packed; router, norms, conv taps,
    MLA's W_UK / W_UV (3-D) and the embedding stay as loaded."""
    ex = CPUExecutor(tiny_model("kimi_k3"), weights="int8", compile=False, progress=False)
    kept = {"embed", "router", "conv"}
    seen = set()
    for op in ex.program.ops:
        for role, w in op.weights.items():
            if isinstance(w, torch.Tensor) and w.dim() == 2:
                assert role in kept, f"{op.kind}.{role} was not packed"
            elif isinstance(w, Int8Weight):
                seen.add(role)
    assert {"latent_up", "latent_down", "shared_gate_up", "shared_down", "q_b", "f_b", "w_in", "w"} <= seen


@pytest.mark.parametrize("group,want", [(8, 8), (0, 40), (128, 40)])
def test_the_int8_group_reaches_the_packed_weights(group, want):
    """int8_group: columns per scale where it divides K (the Llama's QKV weight has K = 40), else per channel."""
    ex = CPUExecutor(tiny_model("llama"), weights="int8", int8_group=group, compile=False, progress=False)
    qkv = [op.weights["w_qkv"] for op in ex.program.ops if "w_qkv" in op.weights]
    assert qkv and all(isinstance(w, Int8Weight) and w.group == want for w in qkv)
    assert all(w.s.shape[1] == 40 // want for w in qkv)
