"""Gaps in the ``cpu`` executor's tests found by mutating ``runtime/cpu``: packed weights against the
original weights (not only against their own ``dequantized()``) at row counts that are not a multiple of
the 4-row tiles, packing when the C++ kernels are unavailable, and fp32 activations for a 16-bit model.
Values from the formats' definitions (``weights.quant``: s·Q; bf16 rounding) and plain torch."""

from __future__ import annotations

import copy

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.model.rows import row_exact
from nonstop.program.lower import lower
from nonstop.runtime.cpu import CPUExecutor
from nonstop.runtime.cpu.kernels import load_kernels
from nonstop.runtime.cpu.pack import LINEAR_ROLES, pack_program
from nonstop.runtime.cpu.packed import Bf16Weight, F32Weight, Int8Weight
from tests.runtime.helpers import tiny_model

KERNELS_MISSING = load_kernels(progress=False)


def _s_q(w: torch.Tensor, group: int) -> torch.Tensor:
    """s·Q of ``weights.quant``'s definition, computed here: s = max |w| / 127 per group, Q = round(w / s)."""
    N, K = w.shape
    blocks = w.double().view(N, K // group, group)
    s = blocks.abs().amax(-1, keepdim=True) / 127
    return (torch.clamp(torch.round(blocks / s), -127, 127) * s).view(N, K)


@pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")
@pytest.mark.parametrize("N,K,group", [(7, 40, 40), (6, 64, 32), (13, 37, 37), (5, 96, 16)])
def test_packed_weights_represent_the_original_rows_at_any_row_count(N, K, group):
    """Row tiles hold 4 rows (N padded to a multiple of 4): each output row must use its own weights and
    int8 scales, so the product equals x·Ŵᵀ with Ŵ from the original W (row 0 scaled 1000x to tell rows apart)."""
    g = torch.Generator().manual_seed(N * K + group)
    w = torch.randn(N, K, generator=g) * torch.logspace(0, -3, N)[:, None]
    x = torch.randn(3, K, generator=g, dtype=torch.float64)
    want = {
        "float32": w.double(),
        "bfloat16": w.bfloat16().double(),
        "int8": _s_q(w, group),
    }
    for fmt, packed in (
        ("float32", F32Weight(w, kernels=True)),
        ("bfloat16", Bf16Weight(w, kernels=True)),
        ("int8", Int8Weight(w, kernels=True, group=group)),
    ):
        assert packed.kernels, fmt
        torch.testing.assert_close(packed.dequantized().double(), want[fmt], rtol=1e-6, atol=1e-9, msg=fmt)
        y = packed.linear(x.float()).double()
        torch.testing.assert_close(y, x @ want[fmt].t(), rtol=1e-4, atol=1e-5, msg=fmt)


@pytest.mark.parametrize("fmt", ["bfloat16", "int8"])
def test_without_kernels_a_16_or_8_bit_format_still_packs_every_linear_weight(fmt):
    """No C++ kernels (no compiler): bf16 / int8 still mean bf16 / s·Q weights (computed in torch), not the
    loaded fp32 ones; only fp32 keeps the loaded tensors."""
    model = tiny_model("llama")
    originals = {name: p.detach().clone() for name, p in model.named_parameters()}
    program = lower(model)
    pack_program(program, fmt, kernels=False)
    kind = {"bfloat16": Bf16Weight, "int8": Int8Weight}[fmt]
    packed = [w for op in program.ops for r, w in op.weights.items() if r in LINEAR_ROLES]
    assert packed and all(isinstance(w, kind) and not w.kernels for w in packed)
    changed = [name for name, p in model.named_parameters() if not torch.equal(p, originals[name])]
    assert changed  # the model now computes with the rounded weights too
    for name in changed:
        before = originals[name]
        want = before.bfloat16().float() if fmt == "bfloat16" else _s_q(before, before.shape[-1]).float()
        torch.testing.assert_close(model.get_parameter(name), want, rtol=1e-6, atol=1e-7)  # K <= 128: per row


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=["fp32-cache", "bf16-cache"])
def test_a_bfloat16_model_decodes_with_fp32_activations(cache_dtype):
    """'activations become fp32' (pack.pack_program): a bf16 model's decode step equals the fp32 reference on
    the same (bf16) weight values to fp32 rounding, far closer than bf16 activations would give; with a cache in
    the model's dtype (what the engine allocates) the fp32 keys / values are stored rounded to it."""
    model = tiny_model("llama").to(torch.bfloat16)
    ex = CPUExecutor(model, weights="bfloat16", compile=False, progress=False)
    assert ex.program.dtype == torch.float32
    twin = copy.deepcopy(model).float()  # the same bf16 values, computed in fp32
    ids = torch.tensor([[17], [23]])
    out, caches = [], []
    for fn in (ex.forward, twin.forward):
        cache = ModelCache(model.cfg, 2, capacity=8, page_size=4, dtype=cache_dtype)
        batch = cache.batch([1, 0], 1)
        out.append(fn(ids, cache, batch, last_only=True).float())
        caches.append(cache)
    torch.testing.assert_close(out[0], out[1], rtol=1e-4, atol=1e-4)
    for a, b in zip(caches[0].layers, caches[1].layers):
        for name in a.tensors:
            assert a.tensors[name].dtype == cache_dtype
            torch.testing.assert_close(a.tensors[name].float(), b.tensors[name].float(), rtol=1e-2, atol=1e-4)


def test_a_one_token_step_inside_row_exact_runs_the_reference():
    """Row-exact mode (``model.rows``) is honoured by the reference only: a one-token step inside it (no
    keep_states) is handed to the reference, and gives its logits bit for bit."""
    model = tiny_model("llama")
    ex = CPUExecutor(model, compile=False, progress=False)
    caches = [ModelCache(model.cfg, 2, capacity=8, page_size=4) for _ in range(2)]
    ids = torch.tensor([[9], [31]])
    out = []
    with row_exact():
        for cache, fn in ((caches[0], ex.forward), (caches[1], model.forward)):
            batch = cache.batch([0, 1], 1)
            out.append(fn(ids, cache, batch, last_only=True))
    assert ex.stats["reference_reasons"] == {"row_exact step": 1} and ex.stats["compiled_steps"] == 0
    assert torch.equal(out[0], out[1])


@pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")
def test_one_token_gqa_attention_runs_the_cpp_kernel_once_per_layer():
    """With the kernels built, a decode step's GQA attention is ``nonstop_cpu::decode_attention`` (reading the
    pool rows in place), once per attention layer, not the gathered twin."""
    from torch.profiler import ProfilerActivity, profile

    model = tiny_model("llama")
    ex = CPUExecutor(model, compile=False, progress=False)
    cache = ModelCache(model.cfg, 2, capacity=8, page_size=4)
    batch = cache.batch([1, 0], 1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ex.forward(torch.tensor([[3], [4]]), cache, batch)
    calls = [e for e in prof.events() if e.name == "nonstop_cpu::decode_attention"]
    assert len(calls) == model.cfg.num_hidden_layers


def test_a_step_compiled_again_is_counted_and_announced(capsys):
    """A call whose torch.compile guards fail (here: grad mode, guarded as global state) compiles the step
    again: ``stats["recompiles"]`` counts it, its time joins ``compiling_s`` and stderr says so."""
    model = tiny_model("llama")
    ex = CPUExecutor(model, compile=True, progress=True)
    cache = ModelCache(model.cfg, 2, capacity=8, page_size=4)
    batch = cache.batch([0, 1], 2)
    model(torch.tensor([[5, 6], [7, 8]]), cache, batch)  # prefilled: every step is of one shape class
    cache.advance(batch)
    ids = torch.tensor([[3], [4]])
    for grad in (False, False, True):
        with torch.set_grad_enabled(grad):
            batch = cache.batch([0, 1], 1)
            ex.forward(ids, cache, batch)
            cache.advance(batch)
    assert ex.stats["recompiles"] == 1 and ex.stats["compiled_steps"] == 3
    assert ex.stats["compiling_s"] > sum(ex.stats["compile_seconds"].values())
    assert "nonstop cpu: the decode step for batch B>1, context L>1 was compiled again (" in capsys.readouterr().err


def test_guards_on_the_fixed_arguments_themselves_are_dropped_too():
    from types import SimpleNamespace

    from nonstop.runtime.cpu.executor import unguarded_fixed_arguments

    names = ["program", "table", "program_x", "tablet", "ids"]
    assert unguarded_fixed_arguments([SimpleNamespace(name=n) for n in names]) == [False, False, True, True, True]


@pytest.mark.parametrize("weights", ["float32", "int8"])
def test_without_the_kernels_the_executor_runs_torch_products_and_streams_nothing(monkeypatch, weights):
    """A machine where the C++ kernels cannot be built (no compiler): torch's products on the packed values, the
    gathered twin for attention, nothing read non-temporally even when NONSTOP_CPU_STREAM=1 asks for it, and
    the reference's tokens."""
    import nonstop.runtime.cpu.executor as cpu_executor
    from nonstop.runtime.cpu.ops import CPU_OPS
    from tests.runtime.helpers import greedy_tokens

    monkeypatch.setattr(cpu_executor, "load_kernels", lambda progress: "RuntimeError: no C++ compiler")
    monkeypatch.setenv("NONSTOP_CPU_STREAM", "1")
    model = tiny_model("llama")
    ex = CPUExecutor(model, weights=weights, compile=False, progress=False)
    assert ex.stats["kernels"] == "RuntimeError: no C++ compiler" and ex.stats["weight_loads"] == "cached"
    assert ex.table is CPU_OPS
    packed = [w for op in ex.program.ops for w in op.weights.values() if hasattr(w, "kernels")]
    assert all(not w.kernels and not w.stream for w in packed)
    assert bool(packed) == (weights == "int8")  # fp32 keeps the loaded tensors
    prompts, max_tokens = [[3, 4, 5, 6, 9], [7, 8]], [5, 3]
    from nonstop.runtime.executors import ReferenceExecutor

    assert greedy_tokens(model, ex, prompts, max_tokens) == greedy_tokens(
        model, ReferenceExecutor(model), prompts, max_tokens
    )
