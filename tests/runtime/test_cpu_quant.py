"""Low-precision weights of the ``cpu`` executor: int8 quantization bounds, the C++ GEMV kernels
against torch on odd shapes, and the quantized executor against the reference model running on the
same (dequantised) weights."""

from __future__ import annotations

import os

import pytest
import torch

from nonstop.program.lower import lower
from nonstop.program.preflight import PreflightError
from nonstop.runtime.cpu import CPUExecutor
from nonstop.runtime.cpu.hugepages import HUGE_PAGE, hugepage_copies, hugepage_empty
from nonstop.runtime.cpu.kernels import load_kernels
from nonstop.runtime.cpu.pack import streams_weights
from nonstop.runtime.cpu.packed import Bf16Weight, F32Weight, Int8Weight, tile_rows, untile_rows
from nonstop.runtime.executors import ReferenceExecutor
from nonstop.weights.quant import dequantize_int8, group_size, quantize_int8
from tests.runtime.helpers import greedy_tokens, tiny_model

KERNELS_MISSING = load_kernels(progress=False)


@pytest.mark.parametrize("shape,group", [((7, 40), 40), ((5, 256), 128), ((3, 4, 96), 32)])
def test_int8_error_is_at_most_half_a_step(shape, group):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 3
    w[..., 0, :group] = 0  # an all-zero group must not divide by zero
    q, s = quantize_int8(w, group)
    assert q.dtype == torch.int8 and s.shape == (*shape[:-1], shape[-1] // group)
    err = (dequantize_int8(q, s) - w).abs().view(*shape[:-1], -1, group)
    assert bool((err <= s[..., None] / 2 + 1e-6).all())
    assert int(q.abs().max()) == 127  # the largest magnitude of a group maps to ±127


def test_group_size_rule():
    assert group_size(256) == 128 and group_size(40) == 40 and group_size(128) == 128 and group_size(384, 64) == 64
    with pytest.raises(ValueError, match="does not divide"):
        quantize_int8(torch.ones(2, 10), 3)


def test_row_tiles_round_trip():
    """Tile t = rows 4t..4t+3 stored [chunk][row][column]: one contiguous stream, zeros past N and K."""
    w = torch.arange(1, 7 * 37 + 1, dtype=torch.float32).view(7, 37)
    tiles = tile_rows(w, 16)
    assert tiles.shape == (8, 48) and torch.equal(untile_rows(tiles, 7, 37, 16), w)
    tile0, tile1 = tiles[:4].reshape(3, 4, 16), tiles[4:].reshape(3, 4, 16)  # [chunk][row][column]
    assert torch.equal(tile0[0, 1], w[1, :16]) and torch.equal(tile0[1, 0], w[0, 16:32])
    assert torch.equal(tile0[2, 2], torch.cat([w[2, 32:], torch.zeros(11)]))  # the last chunk, zero-padded
    assert torch.equal(tile1[1, 2], w[6, 16:32]) and not tile1[:, 3].any()  # row 7 is padding


@pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")
@pytest.mark.parametrize("isa", [2, 1, 0], ids=["avx512", "avx2", "scalar"])
@pytest.mark.parametrize("M,N,K", [(1, 5, 37), (3, 17, 200), (2, 9, 1031), (3, 13, 256), (2, 203, 1031)])
def test_kernels_equal_torch_on_the_same_weights(M, N, K, isa):
    """Every vector path the CPU has (a path it lacks runs the best one it has), odd N and K, fresh inputs;
    tile counts that pair up, leave one over, and (N = 203) split over threads."""
    g = torch.Generator().manual_seed(M * N + K)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(N, K, generator=g)
    bias = torch.randn(N, generator=g)
    best = torch.ops.nonstop_cpu.limit_isa(9)  # what this CPU supports
    assert torch.ops.nonstop_cpu.limit_isa(isa) == min(isa, best)
    try:
        for packed in (F32Weight(w, kernels=True), Bf16Weight(w, kernels=True), Int8Weight(w, kernels=True, group=K)):
            want = x @ packed.dequantized().t() + bias
            cached = packed.linear(x, bias)
            torch.testing.assert_close(cached, want, rtol=1e-5, atol=1e-4)
            packed.stream = True  # non-temporal prefetches: the same products, bit for bit
            assert torch.equal(packed.linear(x, bias), cached)
        for group in [g for g in (8, 32, 128) if K % g == 0]:  # several scales per row (kernel when 16 | group)
            packed = Int8Weight(w, kernels=True, group=group)
            assert packed.kernels == (group % 16 == 0)
            torch.testing.assert_close(
                packed.linear(x[:, None], None)[:, 0], x @ packed.dequantized().t(), rtol=1e-5, atol=1e-4
            )
    finally:
        torch.ops.nonstop_cpu.limit_isa(best)


@pytest.mark.parametrize("weights", ["bfloat16", "int8"])
@pytest.mark.parametrize("name", ["llama", "kimi_k3"])
def test_quantized_executor_equals_the_reference_on_its_weights(name, weights):
    """After packing, the model's parameters hold the values the packed weights represent, so the
    reference on that model is the oracle of the quantized path (up to summation order)."""
    model = tiny_model(name)
    before = model.lm_head_weight.clone()
    ex = CPUExecutor(model, weights=weights, compile=False, progress=False)
    assert ex.stats["weights"] == weights
    assert not torch.equal(before, model.lm_head_weight)  # the model now computes with rounded weights
    prompts, max_tokens = [[3, 4, 5, 6, 9], [7, 8]], [8, 5]
    assert greedy_tokens(model, ex, prompts, max_tokens) == greedy_tokens(
        model, ReferenceExecutor(model), prompts, max_tokens
    )


@pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")
def test_fp32_weights_run_the_tiled_kernel_on_unchanged_values():
    """fp32: every linear weight of the Program is a row-tiled copy for ``linear_f32``, holding exactly the
    loaded values (the model keeps its own, untouched), and the step gives the reference's tokens."""
    model = tiny_model("kimi_k3")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    ex = CPUExecutor(model, weights="float32", compile=False, progress=False)
    plain = lower(model)  # the same Program with the model's own tensors
    packed = 0
    for op, plain_op in zip(ex.program.ops, plain.ops):
        for role, w in op.weights.items():
            if isinstance(w, F32Weight):
                assert w.kernels and torch.equal(untile_rows(w.w, *w.shape, 16), plain_op.weights[role])
                packed += 1
    assert packed >= model.cfg.num_hidden_layers  # at least one per layer
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    prompts, max_tokens = [[3, 4, 5, 6, 9], [7, 8]], [8, 5]
    assert greedy_tokens(model, ex, prompts, max_tokens) == greedy_tokens(
        model, ReferenceExecutor(model), prompts, max_tokens
    )


def test_weights_stream_when_they_outgrow_half_the_cache_where_measured_to_help(monkeypatch):
    monkeypatch.delenv("NONSTOP_CPU_STREAM", raising=False)
    cache = 40 << 20
    for fmt in ("float32", "bfloat16", "int8"):  # AMD, AVX-512 path: every format by size
        assert not streams_weights(20 << 20, fmt, isa=2, cache_bytes=cache, vendor="AuthenticAMD")
        assert streams_weights((20 << 20) + 1, fmt, isa=2, cache_bytes=cache, vendor="AuthenticAMD")
        for vendor in ("GenuineIntel", ""):  # Intel (its NTA prefetch halves the stream) and unknown CPUs: cached
            for isa in (0, 1, 2):
                assert not streams_weights(1 << 40, fmt, isa=isa, cache_bytes=cache, vendor=vendor)
    amd_avx2 = {"cache_bytes": cache, "vendor": "AuthenticAMD", "isa": 1}  # AVX2 path: int8 only
    assert streams_weights(1 << 30, "int8", **amd_avx2)
    assert not streams_weights(20 << 20, "int8", **amd_avx2)
    assert not streams_weights(1 << 30, "float32", **amd_avx2)
    assert not streams_weights(1 << 30, "bfloat16", **amd_avx2)
    assert not streams_weights(1 << 30, "int8", isa=0, cache_bytes=cache, vendor="AuthenticAMD")  # scalar path
    monkeypatch.setenv("NONSTOP_CPU_STREAM", "1")
    assert streams_weights(1, "float32", isa=1, cache_bytes=cache, vendor="GenuineIntel")
    monkeypatch.setenv("NONSTOP_CPU_STREAM", "0")
    assert not streams_weights(1 << 40, "int8", isa=2, cache_bytes=cache, vendor="AuthenticAMD")
    monkeypatch.setenv("NONSTOP_CPU_STREAM", "yes")
    with pytest.raises(ValueError, match="NONSTOP_CPU_STREAM must be 1"):
        streams_weights(1, "int8", isa=2)


@pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")
def test_isa_level_reports_the_path_in_effect_without_changing_it():
    best = torch.ops.nonstop_cpu.limit_isa(9)
    try:
        assert torch.ops.nonstop_cpu.isa_level() == best
        torch.ops.nonstop_cpu.limit_isa(0)
        assert torch.ops.nonstop_cpu.isa_level() == 0 and torch.ops.nonstop_cpu.isa_level() == 0
    finally:
        torch.ops.nonstop_cpu.limit_isa(best)


@pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")
@pytest.mark.parametrize("weights", ["float32", "int8"])
def test_streamed_weights_give_the_reference_tokens(monkeypatch, weights):
    """With the weights read non-temporally (forced: the tiny model would fit any cache), every packed
    weight streams, the executor says so, and the step still gives the reference's tokens."""
    monkeypatch.setenv("NONSTOP_CPU_STREAM", "1")
    model = tiny_model("llama")
    ex = CPUExecutor(model, weights=weights, compile=False, progress=False)
    assert ex.stats["weight_loads"] == "streamed (non-temporal)"
    packed = [w for op in ex.program.ops for w in op.weights.values() if hasattr(w, "stream")]
    assert packed and all(w.stream for w in packed)
    prompts, max_tokens = [[3, 4, 5, 6, 9], [7, 8]], [8, 5]
    assert greedy_tokens(model, ex, prompts, max_tokens) == greedy_tokens(
        model, ReferenceExecutor(model), prompts, max_tokens
    )
    monkeypatch.setenv("NONSTOP_CPU_STREAM", "0")
    assert CPUExecutor(tiny_model("llama"), compile=False, progress=False).stats["weight_loads"] == "cached"


def test_huge_page_copies_keep_values_order_and_alignment():
    """Tensors of several dtypes copied side by side into one allocation starting on a huge-page boundary:
    same values and shapes, each at a 64-byte boundary, in order, none overlapping."""
    g = torch.Generator().manual_seed(3)
    tensors = [
        torch.randn(1031, 517, generator=g),  # 2.1 MB: the allocation spans more than one huge page
        torch.randn(5, 7, generator=g).to(torch.bfloat16),
        torch.randint(-127, 128, (13, 33), generator=g).to(torch.int8),
        torch.randn(3, generator=g),
    ]
    copies = hugepage_copies(tensors)
    assert copies[0].data_ptr() % HUGE_PAGE == 0
    ends = 0
    for t, c in zip(tensors, copies):
        assert torch.equal(t, c) and c.shape == t.shape and c.dtype == t.dtype and c.is_contiguous()
        assert c.data_ptr() % 64 == 0 and c.data_ptr() >= ends
        ends = c.data_ptr() + c.numel() * c.element_size()
    assert hugepage_empty(10, torch.float32).shape == (10,)  # under a huge page: a plain tensor


@pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")
def test_packed_tiles_share_one_huge_page_allocation():
    """After packing, every streamed tile of the Program lies in one allocation, in the Program's order."""
    ex = CPUExecutor(tiny_model("kimi_k3"), weights="int8", compile=False, progress=False)
    seen, tiles = set(), []
    for op in ex.program.ops:
        for w in op.weights.values():
            if isinstance(w, Int8Weight) and id(w) not in seen:
                seen.add(id(w))
                tiles += [w.q, w.s]
    assert len(tiles) > 4 and len({t.untyped_storage().data_ptr() for t in tiles}) == 1
    assert [t.data_ptr() for t in tiles] == sorted(t.data_ptr() for t in tiles)


@pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")
def test_an_fp16_model_keeps_its_weights_exactly():
    """``auto`` on an fp16 model packs fp32 tiles (fp16 widens exactly) and leaves the model's parameters as
    loaded; bf16 tiles would drop three mantissa bits of every weight, in the reference's prefill too."""
    model = tiny_model("llama").to(torch.float16)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    ex = CPUExecutor(model, compile=False, progress=False)
    assert ex.stats["weights"] == "float32"
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    plain = lower(model)
    for op, plain_op in zip(ex.program.ops, plain.ops):
        for role, w in op.weights.items():
            if isinstance(w, F32Weight):
                assert torch.equal(w.dequantized(), plain_op.weights[role].float())
    assert CPUExecutor(tiny_model("llama").to(torch.bfloat16), compile=False, progress=False).weights == "bfloat16"


def test_packing_that_does_not_fit_in_memory_is_refused_or_skipped(monkeypatch):
    """The packed copy must fit beside the loaded weights: fp32 then keeps torch's products on the loaded
    tensors (and says why), bf16 / int8 refuse in one line before allocating."""
    import nonstop.runtime.cpu.executor as cpu_executor

    model = tiny_model("llama")
    lm_head = model.lm_head_weight.numel() * 4
    monkeypatch.setattr(cpu_executor, "available_memory", lambda device: lm_head)  # less than all linear weights
    ex = CPUExecutor(model, weights="float32", compile=False, progress=False)
    assert "row tiles take" in ex.stats["kernels"]
    assert not any(isinstance(w, F32Weight) for op in ex.program.ops for w in op.weights.values())
    prompts, max_tokens = [[3, 4, 5]], [4]
    assert greedy_tokens(model, ex, prompts, max_tokens) == greedy_tokens(
        model, ReferenceExecutor(model), prompts, max_tokens
    )
    with pytest.raises(PreflightError, match="int8 row tiles take .* to pack .* free"):
        CPUExecutor(tiny_model("llama"), weights="int8", compile=False, progress=False)
    with pytest.raises(PreflightError, match="float32 row tiles take .* free"):  # 16-bit weights widen in a copy
        CPUExecutor(tiny_model("llama").to(torch.float16), weights="float32", compile=False, progress=False)


@pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")
def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_load(tmp_path):
    """torch's build lock is a file: a process killed while holding it left one, and every later load
    waited for it for ever (seen after a CI run's workers were killed). Under nonstop's flock it is stale
    and removed: a fresh process, given a copy of the built kernels with that file, loads them."""
    import shutil
    import subprocess
    import sys

    from nonstop.runtime.cpu import kernels

    built = kernels.build_directory()  # load_kernels has built it (this module's KERNELS_MISSING)
    copy = tmp_path / "ext" / built.name
    shutil.copytree(built, copy, ignore=shutil.ignore_patterns("lock", "nonstop.lock"))
    (copy / "lock").touch()
    code = "from nonstop.runtime.cpu.kernels import load_kernels; print(load_kernels(progress=False))"
    env = {**os.environ, "NONSTOP_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr[-2000:]
