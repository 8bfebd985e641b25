"""GPU numerics on a CPU (issue 12 item 4): what the kernels compute in the interpreter, checked with
tolerances a GPU would also meet, and reproducibility.

* ``platform.gpu_numerics_mode``: 16-bit products are exact in fp32 and accumulated in fp32 (the interpreter
  upcasts dot operands, as tensor cores multiply bf16 exactly into fp32 accumulators); a dot the GPU runs in
  tf32 gets operands rounded to tf32 (``gemv.tf32_round``, ``cvt.rna.tf32.f32``). fp32 -> bf16 casts round
  to nearest even as on the GPU (``platform.interpreter_rounds_to_nearest``; Triton's interpreter
  truncates, which made bf16 kernel steps ~3x less accurate than torch's on a CPU only).
* bf16 models of every family: a kernel step is as accurate as torch's own bf16 forward, measured against
  the same weights in fp64. A GPU changes the summation order, exp / rsqrt / division to 2-ulp
  approximations and hence some bf16 roundings - errors of the size the bound allows (twice torch's
  error), not a bitwise or fixed-tolerance match to this CPU.
* The same step run twice gives bit-identical logits, and a row's logits do not depend on which other
  sequences share its batch (no fp32 atomics: the expert down-projection sums slots in a fixed order).
"""

from __future__ import annotations

import copy

import pytest
import torch
import triton
import triton.language as tl

from nonstop.cache.state import ModelCache
from nonstop.kernels import gemv, platform
from nonstop.runtime.executors import ReferenceExecutor
from nonstop.runtime.superop import SuperOpExecutor
from tests.runtime.helpers import skip_unless_kernels, tiny_model
from tests.tiny_configs import TINY_CONFIGS


@triton.jit
def _mm_probe(a_ptr, b_ptr, out_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, TF32_ROUND: tl.constexpr):
    m, k, n = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    tl.store(out_ptr + m[:, None] * N + n[None, :], gemv.mm(a, b, True, "tf32", TF32_ROUND))


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """x rounded to tf32 in torch: 10 mantissa bits, to nearest, ties away from zero (on the magnitude)."""
    bits = x.view(torch.int32).to(torch.int64)
    mag = ((bits & 0x7FFFFFFF) + 0x1000) & ~0x1FFF
    return ((bits & ~0x7FFFFFFF) | mag).to(torch.int32).view(torch.float32)


def test_tf32_rounding_of_dot_operands():
    """fp32 operands of a dot the GPU runs in tf32: rounded first in the numerics mode, exact otherwise."""
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(16, 32, generator=gen), torch.randn(32, 16, generator=gen)
    ties = torch.tensor([1 + 2**-11, -(1 + 3 * 2**-11), 1 + 2**-12])  # halfway cases round away from zero
    assert _tf32(ties).tolist() == [1 + 2**-10, -(1 + 2 * 2**-10), 1.0]
    rounded, exact = torch.full((16, 16), float("nan")), torch.full((16, 16), float("nan"))
    _mm_probe[(1,)](a, b, rounded, 16, 32, 16, True)
    _mm_probe[(1,)](a, b, exact, 16, 32, 16, False)
    want = (_tf32(a).double() @ _tf32(b).double()).float()
    torch.testing.assert_close(rounded, want, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(exact, (a.double() @ b.double()).float(), rtol=1e-6, atol=1e-5)
    assert (rounded - exact).abs().max() > 1e-4  # the rounding is there: tf32 keeps 10 of fp32's 23 bits


def test_numerics_mode_sets_tf32_rounding_for_16_bit_models():
    with platform.gpu_numerics_mode():
        assert platform.dot_mode(torch.bfloat16)["TF32_ROUND"] == platform.interpreting()
        assert platform.dot_mode(torch.float32) == {
            "UPCAST": platform.interpreting(),
            "PREC": "ieee",
            "TF32_ROUND": False,
        }
    with platform.gpu_numerics_mode(False):
        assert not platform.dot_mode(torch.bfloat16)["TF32_ROUND"]


@triton.jit
def _cast_probe(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(y_ptr + i, x.to(tl.bfloat16), mask=i < n)
    tl.store(z_ptr + i, x.to(tl.bfloat16, fp_downcast_rounding="rtz"), mask=i < n)


def test_bf16_casts_round_to_nearest_even():
    """The interpreter's fp32 -> bf16 cast rounds as the GPU and torch do (it truncates unpatched); an
    explicit round-toward-zero cast still truncates."""
    gen = torch.Generator().manual_seed(8)
    special = [
        float("nan"),
        float("inf"),
        -float("inf"),
        3.4e38,
        -0.0,
        1e-40,
        1 + 2**-8,
        1 + 3 * 2**-8,
        -(1 + 2**-8 + 2**-12),
    ]
    x = torch.cat([torch.randn(4000, generator=gen) * 7, torch.tensor(special)])
    y, z = torch.empty(x.numel(), dtype=torch.bfloat16), torch.empty(x.numel(), dtype=torch.bfloat16)
    _cast_probe[(1,)](x, y, z, x.numel(), BLOCK=4096 * 2)
    want = x.to(torch.bfloat16)
    nan = x.isnan()
    assert torch.equal(y.view(torch.int16)[~nan], want.view(torch.int16)[~nan]) and y[nan].isnan().all()
    truncated = (x.view(torch.int32) >> 16).to(torch.int16)
    normal = x.isfinite() & (x.abs() >= 2**-126)  # (the interpreter's own subnormal truncation is off)
    assert torch.equal(z.view(torch.int16)[normal], truncated[normal])
    assert (y != z).sum() > 1000  # about half of random values round up


# ----------------------------------------------------------------------------- bf16 steps of every family

PROMPT = [3, 14, 15, 9, 2]


def _logits(executor, model, dtype, tokens=PROMPT) -> torch.Tensor:
    """fp64 logits [V] of the last token after ``tokens``: a prefill step through the program, then one
    decode step."""
    cache = ModelCache(model.cfg, 1, capacity=16, dtype=dtype, device="cpu", page_size=4)
    ids = torch.tensor([[t % model.cfg.vocab_size for t in tokens]])
    batch = cache.batch([0], ids.shape[1] - 1)
    executor.forward(ids[:, :-1], cache, batch)
    cache.advance(batch)
    batch = cache.batch([0], 1)
    return executor.forward(ids[:, -1:], cache, batch)[0, -1].double()


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_bf16_step_is_as_accurate_as_torch(name):
    model = tiny_model(name, dtype=torch.bfloat16)
    skip_unless_kernels(model)
    exact = _logits(ReferenceExecutor(copy.deepcopy(model).to(torch.float64)), model, torch.float64)
    torch_bf16 = _logits(ReferenceExecutor(model), model, torch.bfloat16)
    with platform.gpu_numerics_mode():
        kernels = _logits(SuperOpExecutor(model), model, torch.bfloat16)
    torch_err = (torch_bf16 - exact).norm()
    kernel_err = (kernels - exact).norm()
    assert torch_err > 0  # bf16 does round: the bound below is not vacuous
    assert kernel_err <= 2 * torch_err + 1e-3 * exact.norm(), (float(kernel_err), float(torch_err))


# ----------------------------------------------------------------------------- reproducibility


def _batch_logits(executor, model, prompts: list[list[int]]) -> torch.Tensor:
    """Logits [B, V] of one decode step after prefilling ``prompts`` (same length) together."""
    cfg = model.cfg
    cache = ModelCache(cfg, len(prompts), capacity=16, dtype=torch.float32, device="cpu", page_size=4)
    ids = torch.tensor([[t % cfg.vocab_size for t in p] for p in prompts])
    slots = list(range(len(prompts)))
    batch = cache.batch(slots, ids.shape[1] - 1)
    executor.forward(ids[:, :-1], cache, batch)
    cache.advance(batch)
    return executor.forward(ids[:, -1:], cache, cache.batch(slots, 1))[:, -1]


@pytest.mark.parametrize("backend", ["superop", "megakernel"])
def test_same_step_twice_gives_identical_logits(backend):
    """Kimi K3 (MoE with shared experts, KDA, MLA, AttnRes): two runs of the same step, bit for bit; and a
    row's logits are the same bits whether its sequence runs alone (B = 1: one row a step) or in a batch of 3
    or 5 at any place, whichever sequences share it (the experts the batch selects differ): every GEMV takes
    one reduction path for every row count (``platform.row_block``), and the expert down-projection sums
    its slots in a fixed order."""
    from nonstop.runtime.megakernel.executor import MegakernelExecutor

    model = tiny_model("kimi_k3")
    skip_unless_kernels(model)
    executor = SuperOpExecutor(model) if backend == "superop" else MegakernelExecutor(model, graphs=False)
    a, b, c, d, e = [5, 6, 7], [40, 2, 17], [61, 62, 3], [1, 99, 250], [33, 8, 120]
    three = _batch_logits(executor, model, [b, a, c])
    assert torch.equal(three, _batch_logits(executor, model, [b, a, c]))
    alone = _batch_logits(executor, model, [a])
    assert torch.equal(alone[0], three[1])
    five = _batch_logits(executor, model, [d, e, c, b, a])
    assert not torch.equal(three[0], three[1])  # different sequences, different logits: the checks can fail
    assert torch.equal(five[4], alone[0])
    assert torch.equal(five[3], three[0]) and torch.equal(five[2], three[2])
