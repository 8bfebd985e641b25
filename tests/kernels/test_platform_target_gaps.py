"""Gaps a third mutation audit of ``kernels/platform.py`` found, with no GPU: occupancy at the edges of the
register limits (worked out by hand from the CUDA occupancy rules), the target of a CUDA device read from a
stand-in ``torch.cuda.get_device_properties``, the environment knobs (interpreter, GPU numerics mode) and
what the dot policy and pipeline depth make of them, bf16 rounding ties, and the interpreter's rounding
patch (installed once, fp32 -> bf16 only)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from nonstop.kernels import platform
from nonstop.kernels.platform import H100

# ----------------------------------------------------------------------------- occupancy


def test_255_registers_a_thread_still_run_256_do_not():
    """255 registers is the per-thread maximum, not over it: 255 x 32 -> 8160, 8192 a warp; 65536 // 8192 = 8
    warps, one CTA of 8 warps. 256 is over the limit even with no shared memory (0 CTAs, not 1)."""
    assert H100.occupancy(255, 0, 8) == 1
    assert H100.occupancy(256, 0, 8) == 0
    assert H100.occupancy(256, 0, 1) == 0


def test_a_cta_whose_warps_need_more_registers_than_an_sm_has_cannot_run():
    """255 registers x 16 warps: 16 x 8192 = 131072 registers > 65536 - 0 CTAs (a kernel that cannot launch),
    not rounded up to one."""
    assert H100.occupancy(255, 0, 16) == 0
    assert H100.occupancy(64, 0, 32) == 1  # 64 x 32 = 2048 a warp: 32 warps fit (and 1024 threads)


def test_registers_bound_whole_ctas_not_warps():
    """128 registers: 4096 a warp, 16 warps an SM - 2 CTAs of 8 warps (threads alone would allow 8)."""
    assert H100.occupancy(128, 0, 8) == 2
    assert H100.occupancy(128, 0, 2) == 8


def test_a_light_one_warp_kernel_is_capped_at_32_ctas_an_sm():
    """0 (or 1) registers, 1 warp, no shared memory: registers would allow 256 CTAs, shared memory 228
    (1 KiB reserved each), threads 64 - the hardware's 32 CTAs an SM bind. 0 registers counts as one."""
    assert H100.occupancy(0, 0, 1) == 32
    assert H100.occupancy(1, 0, 1) == 32


def test_pow2_of_nothing_is_one_even_with_no_lower_bound():
    """``pow2(0, lo=0)`` is 1 (2^0), not 2: the floor of one keeps ``(n - 1).bit_length()`` off -1."""
    assert platform.pow2(0, lo=0) == 1
    assert platform.pow2(-5, lo=0) == 1
    assert platform.pow2(1, lo=0) == 1 and platform.pow2(3, lo=0) == 4


# ----------------------------------------------------------------------------- a CUDA device's target


def _props(**over):
    """An Ada-like device (sm_89) whose every limit differs from the H100 defaults."""
    values = dict(
        name="Fake GPU",
        major=8,
        minor=9,
        multi_processor_count=76,
        regs_per_multiprocessor=32768,
        shared_memory_per_multiprocessor=102400,
        shared_memory_per_block_optin=101376,
        max_threads_per_multi_processor=1536,
    )
    values.update(over)
    return SimpleNamespace(**{k: v for k, v in values.items() if v is not None})


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda with stand-in device properties (device 1 the current one); the target cache emptied.
    Returns the list of indices whose properties were asked for."""
    asked = []
    devices = {0: _props(), 1: _props(name="Other GPU", major=9, minor=0, multi_processor_count=132)}

    def get_device_properties(index):
        asked.append(index)
        return devices[index]

    monkeypatch.setattr(torch.cuda, "get_device_properties", get_device_properties)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(platform, "_devices", {})
    monkeypatch.setattr(platform, "_simulated", [])
    return devices, asked


def test_a_cuda_target_is_the_devices_own_limits(fake_cuda):
    """Name (with sm_<major><minor>), SM count, arch (10 x major + minor) and each of the four limits torch
    reports replace the H100's; the others (registers a thread, allocation unit, CTA cap) stay."""
    t = platform.cuda_target(0)
    assert t.name == "Fake GPU (sm_89)"
    assert (t.gpu, t.sms, t.arch) == (True, 76, 89)
    assert (t.regs_per_sm, t.smem_per_sm, t.smem_per_block, t.threads_per_sm) == (32768, 102400, 101376, 1536)
    assert (t.regs_per_thread, t.reg_alloc_unit, t.ctas_per_sm) == (255, 256, 32)
    # its occupancy uses them: 32 registers x 8 warps = 8192 a CTA, 4 CTAs by 32768 registers
    assert t.occupancy(32, 0, 8) == 4
    assert H100.occupancy(32, 0, 8) == 8  # (the H100 has room for 8)


def test_limits_torch_does_not_report_keep_the_h100_values(fake_cuda):
    """An older torch has no ``shared_memory_per_block_optin`` / ``regs_per_multiprocessor``, and a property
    may read 0: the H100 defaults stand in (no AttributeError)."""
    devices, _ = fake_cuda
    devices[0] = _props(shared_memory_per_block_optin=None, regs_per_multiprocessor=None)
    devices[0].max_threads_per_multi_processor = 0
    t = platform.cuda_target(0)
    assert (t.smem_per_block, t.regs_per_sm, t.threads_per_sm) == (232448, 65536, 2048)
    assert t.smem_per_sm == 102400


def test_a_cuda_target_is_read_once_per_device(fake_cuda):
    """The properties of a device are asked for once (``target`` is called on every launch); each device
    has its own target."""
    _, asked = fake_cuda
    first = platform.cuda_target(0)
    assert platform.cuda_target(0) is first
    other = platform.cuda_target(1)
    assert other.name == "Other GPU (sm_90)" and other.arch == 90 and other.sms == 132
    assert asked == [0, 1]


def test_target_of_a_device(fake_cuda):
    """``cuda:0`` is device 0's target, bare ``cuda`` the current device's (1), CPU and meta the
    interpreter's; a simulated target overrides all of them."""
    assert platform.target("cuda:0").name == "Fake GPU (sm_89)"
    assert platform.target(torch.device("cuda")).name == "Other GPU (sm_90)"
    assert platform.num_sms("cuda:0") == 76 and platform.on_gpu("cuda:0")
    assert platform.target("cpu") is platform.INTERPRETER and platform.target("meta") is platform.INTERPRETER
    assert platform.target() is platform.INTERPRETER and not platform.on_gpu()
    with platform.simulating(platform.H200):
        assert platform.target("cuda:0") is platform.H200
    with platform.simulating(H100), platform.simulating(platform.H200):
        assert platform.target("cpu") is platform.H200


# ----------------------------------------------------------------------------- environment knobs


def test_pipeline_stages_and_upcast_follow_the_interpreter(monkeypatch):
    """In the interpreter every loop is one stage and dots are upcast; on a GPU ``gpu_stages`` stages and
    no upcast."""
    monkeypatch.setenv(platform.INTERPRET_ENV, "1")
    assert platform.pipeline_stages() == 1 and platform.pipeline_stages(4) == 1
    assert platform.upcast_dots() is True
    monkeypatch.setenv(platform.INTERPRET_ENV, "0")
    assert platform.pipeline_stages() == 3 and platform.pipeline_stages(4) == 4
    assert platform.upcast_dots() is False


def test_dot_precision_is_ieee_for_fp32_models_only():
    assert platform.dot_precision(torch.float32) == "ieee"
    assert platform.dot_precision(torch.bfloat16) == "tf32"
    assert platform.dot_precision(torch.float16) == "tf32"


def test_the_numerics_mode_is_off_unless_set_to_something_but_0(monkeypatch):
    """Unset, empty and ``0`` are off; ``1`` (or any other value) is on."""
    monkeypatch.delenv(platform.NUMERICS_ENV, raising=False)
    assert platform.gpu_numerics() is False
    for value, on in {"": False, "0": False, "1": True, "2": True}.items():
        monkeypatch.setenv(platform.NUMERICS_ENV, value)
        assert platform.gpu_numerics() is on, value


def test_the_numerics_mode_block_restores_the_environment(monkeypatch):
    """Unset before: unset after (not left at 0 or 1); set before: that value after, whatever the block set;
    ``gpu_numerics_mode(False)`` turns the mode off within."""
    monkeypatch.delenv(platform.NUMERICS_ENV, raising=False)
    with platform.gpu_numerics_mode():
        assert platform.gpu_numerics()
    assert platform.NUMERICS_ENV not in os.environ
    monkeypatch.setenv(platform.NUMERICS_ENV, "1")
    with platform.gpu_numerics_mode(False):
        assert not platform.gpu_numerics()
    assert os.environ[platform.NUMERICS_ENV] == "1"
    monkeypatch.setenv(platform.NUMERICS_ENV, "0")
    with platform.gpu_numerics_mode(True):
        assert platform.gpu_numerics()
    assert os.environ[platform.NUMERICS_ENV] == "0"


def test_dot_mode_rounds_tf32_only_in_the_interpreter_for_16_bit_models(monkeypatch):
    """TF32_ROUND needs all three: the interpreter (a GPU rounds by itself), the numerics mode, a tf32 dot."""
    monkeypatch.setenv(platform.NUMERICS_ENV, "1")
    monkeypatch.setenv(platform.INTERPRET_ENV, "1")
    assert platform.dot_mode(torch.bfloat16) == {"UPCAST": True, "PREC": "tf32", "TF32_ROUND": True}
    assert platform.dot_mode(torch.float32) == {"UPCAST": True, "PREC": "ieee", "TF32_ROUND": False}
    monkeypatch.setenv(platform.INTERPRET_ENV, "0")
    assert platform.dot_mode(torch.bfloat16) == {"UPCAST": False, "PREC": "tf32", "TF32_ROUND": False}
    monkeypatch.setenv(platform.INTERPRET_ENV, "1")
    monkeypatch.setenv(platform.NUMERICS_ENV, "0")
    assert platform.dot_mode(torch.bfloat16) == {"UPCAST": True, "PREC": "tf32", "TF32_ROUND": False}


# ----------------------------------------------------------------------------- bf16 rounding


def test_bf16_rounding_ties_go_to_even_and_signs_stay():
    """By hand: 0x3F80_8000 is halfway with an even low bit (stays 0x3F80), 0x3F81_8000 halfway with an odd
    one (up to 0x3F82), 0x3F80_8001 past halfway (0x3F81), 0x3F80_7FFF below (0x3F80); negative values round
    on the magnitude; infinities stay infinite; a NaN is quieted (0x40) and keeps its sign."""
    bits = np.array(
        [0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0xBF818000, 0xBF807FFF, 0x7F800000, 0xFF800000, 0xFF800001],
        dtype=np.uint32,
    )
    got = platform._bf16_round_to_nearest_even(bits)
    assert got.dtype == np.uint16
    assert got.tolist() == [0x3F80, 0x3F82, 0x3F81, 0x3F80, 0xBF82, 0xBF80, 0x7F80, 0xFF80, 0xFFC0]


# ----------------------------------------------------------------------------- the interpreter's rounding patch


@pytest.fixture
def pristine_convert(monkeypatch):
    """The interpreter's own ``_convert_float`` (unwrapped), restored after the test."""
    interpreter = pytest.importorskip("triton.runtime.interpreter")
    convert = interpreter._convert_float
    while getattr(convert, "rounds_to_nearest", False):  # the patch nonstop's kernel modules installed
        convert = convert.__closure__[convert.__code__.co_freevars.index("convert")].cell_contents
    monkeypatch.setattr(interpreter, "_convert_float", convert)
    return interpreter


def test_the_rounding_patch_is_installed_once(pristine_convert):
    """A second install keeps the first wrapper (not a wrapper of the wrapper: every cast would go through
    one more layer per call)."""
    interpreter = pristine_convert
    assert not getattr(interpreter._convert_float, "rounds_to_nearest", False)
    assert platform.interpreter_rounds_to_nearest() is True
    first = interpreter._convert_float
    assert first.rounds_to_nearest
    assert platform.interpreter_rounds_to_nearest() is True
    assert interpreter._convert_float is first


def test_the_patch_is_refused_when_the_interpreter_has_no_converter(monkeypatch):
    """A Triton without ``_convert_float`` is left alone (False), not patched with a wrapper of nothing."""
    interpreter = pytest.importorskip("triton.runtime.interpreter")
    monkeypatch.delattr(interpreter, "_convert_float")
    assert platform.interpreter_rounds_to_nearest() is False
    assert not hasattr(interpreter, "_convert_float")


def test_the_patch_rounds_fp32_to_bf16_only_and_keeps_shapes(pristine_convert):
    """Through the patched converter: fp32 -> bf16 rounds to nearest (1 + 3·2^-9 -> 1 + 2^-7, where truncation
    gives 1 + 2^-8), in any shape; round-toward-zero still truncates; fp32 -> fp16, bf16 -> fp32 and fp8 -> bf16
    are the interpreter's own conversions (numpy's fp16 cast; bf16 bits shifted up; fp8 widened exactly)."""
    import triton.language as tl
    from triton._C.libtriton import ir

    interpreter = pristine_convert
    platform.interpreter_rounds_to_nearest()
    convert = interpreter._convert_float
    x = np.array([[1 + 3 * 2**-9, -2.5], [3.0, 1 + 2**-12]], dtype=np.float32)
    got = convert(x, tl.float32, tl.bfloat16, None)
    assert got.shape == (2, 2)
    assert got.view(np.uint16).tolist() == [[0x3F81, 0xC020], [0x4040, 0x3F80]]
    rtz = convert(x, tl.float32, tl.bfloat16, ir.ROUNDING_MODE.RTZ)
    assert rtz.view(np.uint16).reshape(-1)[0] == 0x3F80  # 1 + 2^-8 truncated away
    half = convert(x, tl.float32, tl.float16, None)
    assert np.array_equal(np.asarray(half).view(np.float16).reshape(2, 2), x.astype(np.float16))
    bf = np.array([0x3F81, 0xC020], dtype=np.uint16)
    up = convert(bf, tl.bfloat16, tl.float32, None)
    assert np.asarray(up).view(np.float32).tolist() == [1 + 2**-7, -2.5]
    # fp8 (e5m2) -> bf16, exact: 0x3E = 1.5, 0xC0 = -2, 0x3C = 1, 0x41 = 2 x 1.25 (not read as fp32 bits)
    e5m2 = np.array([0x3E, 0xC0, 0x3C, 0x41], dtype=np.uint8)
    widened = convert(e5m2, tl.float8e5, tl.bfloat16, None)
    assert np.asarray(widened).view(np.uint16).tolist() == [0x3FC0, 0xC000, 0x3F80, 0x4020]
