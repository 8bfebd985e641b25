"""Gaps a mutation audit of ``kernels/platform.py`` found: the occupancy of a kernel against an SM's limits,
each limit alone binding, with the numbers worked out by hand from the CUDA occupancy rules (registers given
to a warp in units of 256, 1 KiB of shared memory reserved per CTA, the per-block shared-memory maximum,
2048 threads per SM)."""

from __future__ import annotations

from dataclasses import replace

from nonstop.kernels import platform

# 3 SMs, 16384 registers, 48 KiB shared memory an SM, at most 16 KiB a CTA
TINY = replace(platform.H100, name="tiny", sms=3, regs_per_sm=16384, smem_per_sm=49152, smem_per_block=16384)


def test_registers_are_given_to_a_warp_in_units_of_256():
    # 33 registers x 32 threads = 1056 -> 1280 a warp; 16384 // 1280 = 12 one-warp CTAs (not 16384 // 1056 = 15)
    assert TINY.occupancy(33, 0, 1) == 12
    # 32 x 32 = 1024 exactly: 16 warps, 4 CTAs of 4 warps
    assert TINY.occupancy(32, 0, 4) == 4


def test_every_cta_loses_one_kib_of_shared_memory_to_the_driver():
    # 12 KiB + 1 KiB reserved: 49152 // 13312 = 3 CTAs (not 49152 // 12288 = 4)
    assert replace(TINY, smem_per_block=49152).occupancy(8, 12288, 1) == 3
    assert replace(TINY, smem_per_block=49152).occupancy(8, 15360, 1) == 3  # 15 + 1 KiB: exactly 3


def test_a_cta_over_the_per_block_shared_memory_limit_cannot_run():
    # 20000 bytes would fit an SM twice over, but a CTA may use at most 16 KiB
    assert TINY.occupancy(8, 20000, 1) == 0
    assert TINY.occupancy(8, 16384, 1) == 2  # 49152 // (16384 + 1024)


def test_threads_bound_the_ctas_of_a_light_kernel():
    # 16 registers x 256 threads: the registers allow 16 CTAs of 8 warps, 2048 threads an SM only 8
    assert platform.H100.occupancy(16, 0, 8) == 8
    assert platform.H100.occupancy(16, 0, 4) == 16


def test_pow2_is_the_smallest_power_of_two_at_least_n():
    assert [platform.pow2(n) for n in (0, 1, 2, 3, 4, 5, 16, 17, 1000, 1024)] == [1, 1, 2, 4, 4, 8, 16, 32, 1024, 1024]
    assert platform.pow2(3, lo=16) == 16 and platform.pow2(17, lo=16) == 32
    assert [platform.row_block(r)[0] for r in (1, 5, 16, 17)] == [16, 16, 16, 32]


def test_wide_load_k_gives_each_thread_one_16_byte_load():
    """[block_n, K] elements of elem_bytes over 32·warps threads: 16 bytes a thread."""
    for block_n, elem_bytes, warps in [(64, 2, 8), (16, 2, 8), (32, 1, 8), (8, 4, 4), (128, 2, 4)]:
        k = platform.wide_load_k(block_n, elem_bytes, warps)
        assert block_n * k * elem_bytes == 16 * 32 * warps, (block_n, elem_bytes, warps, k)
    assert platform.wide_load_k(64) == 32  # bf16, 8 warps: 8 elements x 256 threads / 64 rows
    assert platform.wide_load_k(8192) == 1  # never below one column


def test_the_interpreter_flag_reads_as_triton_reads_it(monkeypatch):
    """nonstop and Triton must agree on whether the interpreter is on: ``TRITON_INTERPRET=false`` made nonstop
    take the interpreter path while Triton looked for a GPU driver (a traceback on a CPU; the GPU paths
    skipped on a GPU). Triton's own knob is the oracle."""
    from triton import knobs

    expected = {"": False, "0": False, "1": True, "true": True, "yes": True, "false": False, "off": False}
    expected |= {"2": False, "ON": True, "Y": True, "no": False}
    for value, on in expected.items():
        monkeypatch.setenv(platform.INTERPRET_ENV, value)
        assert platform.interpreting() is on is knobs.runtime.interpret, value
    monkeypatch.delenv(platform.INTERPRET_ENV)
    assert platform.interpreting() is False


def test_bf16_rounding_keeps_every_nan_a_nan():
    """fp32 NaNs whose payload sits in the low 16 bits (0x7F800001: rounding the mantissa up would carry into
    the exponent and give infinity) stay NaN, of either sign; infinities and the largest finite values round
    as torch rounds them."""
    import numpy as np
    import torch

    bits = np.array(
        [0x7F800001, 0x7F80FFFF, 0xFF800001, 0x7FC00000, 0x7FFFFFFF, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x3F808000],
        dtype=np.uint32,
    )
    got = torch.from_numpy(platform._bf16_round_to_nearest_even(bits).astype(np.int16)).view(torch.bfloat16)
    want = torch.from_numpy(bits.view(np.float32).copy()).to(torch.bfloat16)
    assert torch.isnan(got[:5]).all(), got
    assert torch.equal(got[5:], want[5:]), (got, want)


def test_the_innermost_simulated_target_wins():
    with platform.simulating(platform.H100):
        with platform.simulating(TINY):
            assert platform.target("cpu") is TINY and platform.num_sms() == 3
        assert platform.target() is platform.H100
    assert platform.target("cpu") is platform.INTERPRETER
