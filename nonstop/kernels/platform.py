"""What the kernels know about the machine they run on, in one place.

* ``interpreting()``: Triton's CPU interpreter is on (``TRITON_INTERPRET=1``, read when a module's
  ``@triton.jit`` decorators run, so it must be set before the kernel modules are imported).
* ``Target``: the device the launch parameters are chosen for - SM count, register file, shared memory,
  thread and CTA limits - and ``ctas_per_sm`` (occupancy) of a compiled kernel against them.
  ``target(device)`` is the CUDA device's own (from torch), the interpreter's stand-in (2 "SMs": fewer,
  larger tiles interpret faster), or the target set by ``simulating(...)``: the offline GPU check records
  launches with weights on the meta device as they would be made on that GPU.
* powers of two (``pow2``), the row block of a decode step (``row_block``: one for every row count), and
  the dot policy: the interpreter's bf16 ``tl.dot`` is wrong, so its operands are upcast to fp32 there
  (``upcast_dots``); fp32 models multiply exactly (``"ieee"``), 16-bit models on tensor cores
  (``dot_precision``).
* the GPU numerics mode (``gpu_numerics``, env ``NONSTOP_GPU_NUMERICS=1``): the interpreter rounds the
  operands of every dot the GPU would run in tf32 to tf32 first, so a CPU test sees the GPU's rounding
  (16-bit products are exact in fp32 either way; the sums are fp32 on both).
* ``interpreter_rounds_to_nearest()``: Triton's interpreter truncates fp32 -> bf16 casts (the GPU rounds to
  nearest even, ``cvt.rn.bf16.f32``); the kernel modules install the GPU's rounding when interpreting.
* ``interpreter_skips_repeated_work()``: three pieces of work Triton's interpreter repeats without effect are
  skipped (same results, about half the time of an interpreted decode step); installed with the rounding.

Pure Python: importing this module does not import Triton.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace

INTERPRET_ENV = "TRITON_INTERPRET"
NUMERICS_ENV = "NONSTOP_GPU_NUMERICS"


# ``maxnreg`` for launches whose compiled kernel needs more than 128 registers a thread at 8 warps: without it
# ptxas may cap such a kernel at 128 (two CTAs per SM) and spill (seen with Triton 3.6; ``nonstop gpucheck``)
MAX_REGISTERS = 255

# the most warps a tile function runs under: the megakernel runs every task class at 8 warps, whatever its own
# launcher uses, so a tile's weight blocks must give each of 8 warps' threads whole 16-byte loads
TILE_WARPS = 8


# the values Triton's boolean environment knobs read as on (case-insensitive, not stripped); anything else is off
TRUE_ENV_VALUES = ("1", "true", "on", "yes", "y")


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``), read as Triton reads it:
    ``false`` / ``off`` / ``2`` leave the interpreter off, and nonstop must agree (else it skips the GPU paths
    while Triton compiles for a GPU)."""
    return os.environ.get(INTERPRET_ENV, "").lower() in TRUE_ENV_VALUES


@dataclass(frozen=True)
class Target:
    """A device kernels are launched (or compiled) for. ``gpu``: GPU block sizes (else the interpreter's).
    Limits are per SM unless named per block; H100 / H200 (sm_90) values by default."""

    name: str
    gpu: bool
    sms: int
    arch: int | None = 90
    regs_per_sm: int = 65536
    regs_per_thread: int = 255
    reg_alloc_unit: int = 256  # registers are given to a warp in units of 256
    sub_partitions: int = 4  # the register file is split among 4 SM sub-partitions; a warp lives in one
    smem_per_sm: int = 233472  # 228 KiB
    smem_per_block: int = 232448  # 227 KiB (opt-in maximum)
    smem_reserved_per_block: int = 1024  # the driver keeps 1 KiB of every CTA's shared memory
    smem_alloc_unit: int = 128  # a CTA's shared memory (reserve included) is given in units of 128 B (sm_8x / 9x)
    threads_per_sm: int = 2048
    ctas_per_sm: int = 32

    def occupancy(self, registers: int, shared_bytes: int, num_warps: int) -> int:
        """CTAs of a kernel (``registers`` per thread, ``shared_bytes`` per CTA, ``num_warps``) that fit on
        one SM at once (0: it cannot run here). The rules of NVIDIA's occupancy calculator (``cuda_occupancy.h``):
        a warp's registers (``registers`` x 32 rounded up to ``reg_alloc_unit``) come from one sub-partition, so an
        SM holds ``sub_partitions`` x (registers of a sub-partition // a warp's) warps; a CTA's shared memory plus
        the reserve is rounded up to ``smem_alloc_unit``."""
        if registers > self.regs_per_thread or shared_bytes > self.smem_per_block:
            return 0
        per_warp = _round_up(max(registers, 1) * 32, self.reg_alloc_unit)
        warps = self.regs_per_sm // self.sub_partitions // per_warp * self.sub_partitions
        by_regs = warps // num_warps
        by_smem = self.smem_per_sm // _round_up(shared_bytes + self.smem_reserved_per_block, self.smem_alloc_unit)
        by_threads = self.threads_per_sm // (32 * num_warps)
        return max(0, min(by_regs, by_smem, by_threads, self.ctas_per_sm))


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


H100 = Target("H100 SXM (sm_90a)", gpu=True, sms=132)
H200 = Target("H200 (sm_90a)", gpu=True, sms=132)
INTERPRETER = Target("Triton interpreter", gpu=False, sms=2, arch=None)
TARGETS = {"h100": H100, "h200": H200}

_simulated: list[Target] = []
_devices: dict[int, Target] = {}


@contextlib.contextmanager
def simulating(target: Target):
    """Within the block ``target(device)`` is ``target`` for every device (launches recorded on meta or
    CPU tensors as they would be made on that GPU)."""
    _simulated.append(target)
    try:
        yield target
    finally:
        _simulated.pop()


def cuda_target(index: int) -> Target:
    """The CUDA device's target, from torch's device properties (cached)."""
    if index not in _devices:
        import torch

        p = torch.cuda.get_device_properties(index)
        base = replace(
            H100, name=f"{p.name} (sm_{p.major}{p.minor})", sms=p.multi_processor_count, arch=10 * p.major + p.minor
        )
        limits = {
            "regs_per_sm": "regs_per_multiprocessor",
            "smem_per_sm": "shared_memory_per_multiprocessor",
            "smem_per_block": "shared_memory_per_block_optin",
            "threads_per_sm": "max_threads_per_multi_processor",
        }
        base = replace(
            base, **{ours: int(getattr(p, theirs)) for ours, theirs in limits.items() if getattr(p, theirs, None)}
        )
        _devices[index] = base
    return _devices[index]


def target(device=None) -> Target:
    """The target of launches on ``device`` (see the module docstring)."""
    if _simulated:
        return _simulated[-1]
    if device is not None:
        import torch

        device = torch.device(device)
        if device.type == "cuda":
            return cuda_target(device.index if device.index is not None else torch.cuda.current_device())
    return INTERPRETER


def num_sms(device=None) -> int:
    """Streaming multiprocessors of ``device``'s target (the interpreter's stand-in: 2)."""
    return target(device).sms


def on_gpu(device=None) -> bool:
    """Are launches on ``device`` made for a GPU (GPU block sizes)?"""
    return target(device).gpu


# ----------------------------------------------------------------------------- sizes


def pow2(n: int, lo: int = 1) -> int:
    """The smallest power of two >= max(n, lo)."""
    n = max(int(n), int(lo), 1)
    return 1 << (n - 1).bit_length()


def row_block(rows: int) -> tuple[int, bool]:
    """(BLOCK_R, USE_DOT) for a step of ``rows`` rows: ``tl.dot`` with the rows padded to a power of two >= 16
    (tl.dot's smallest M) - 16 for every decode step (<= 16 rows), one row included. One reduction path and
    one K order for every row count, so a row's result has the same bits whatever else the step holds (a
    batch of 1, 3 or 16 sequences; a decode step or a speculative verification). Decode is bandwidth-bound:
    the padded rows cost tensor-core cycles, not bytes; the registers are those of a 16-row step, which
    ``nonstop gpucheck`` checks."""
    return pow2(rows, 16), True


def wide_load_k(block_n: int, elem_bytes: int = 2, warps: int = TILE_WARPS) -> int:
    """The smallest K block at which a [block_n, K] weight tile of ``elem_bytes`` elements gives each of the
    32·``warps`` threads one 16-byte load (``ld.global.v4``): K = (16 / elem_bytes)·32·warps / block_n.
    Below it a thread holds fewer than 16 bytes of the tile and the weight streams in narrower loads."""
    return max(1, (16 // elem_bytes) * 32 * warps // block_n)


def pipeline_stages(gpu_stages: int = 3) -> int:
    """``num_stages`` of the kernels' ``tl.range`` loops: ``gpu_stages`` on a GPU, 1 in the interpreter."""
    return 1 if interpreting() else gpu_stages


# ----------------------------------------------------------------------------- dots


def upcast_dots() -> bool:
    """Feed ``tl.dot`` fp32 operands: in the interpreter (its bf16 dot multiplies raw bits)."""
    return interpreting()


def dot_precision(dtype) -> str:
    """``input_precision`` of ``tl.dot`` for a model of ``dtype``: exact fp32 (``"ieee"``) for fp32
    models; ``"tf32"`` otherwise (16-bit operands run on tensor cores anyway; an fp32 operand of a
    16-bit model - e.g. an fp32 partial sum - is rounded to tf32, as the GPU does)."""
    import torch

    return "ieee" if dtype == torch.float32 else "tf32"


def gpu_numerics() -> bool:
    """GPU numerics mode (``NONSTOP_GPU_NUMERICS=1``): the interpreter rounds tf32 dot operands."""
    return os.environ.get(NUMERICS_ENV, "0") not in ("", "0")


@contextlib.contextmanager
def gpu_numerics_mode(on: bool = True):
    """Within the block launches use the GPU numerics mode (a launch reads it when it is made)."""
    before = os.environ.get(NUMERICS_ENV)
    os.environ[NUMERICS_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NUMERICS_ENV, None)
        else:
            os.environ[NUMERICS_ENV] = before


def dot_mode(dtype) -> dict:
    """The constexprs of ``gemv.mm`` for a model of ``dtype``: UPCAST (fp32 operands in the interpreter),
    PREC (``dot_precision``) and TF32_ROUND (the numerics mode's tf32 operand rounding)."""
    prec = dot_precision(dtype)
    return {"UPCAST": upcast_dots(), "PREC": prec, "TF32_ROUND": upcast_dots() and gpu_numerics() and prec == "tf32"}


def _bf16_round_to_nearest_even(bits32):
    """fp32 bit patterns (numpy uint32) -> bf16 bit patterns (uint16), to nearest, ties to even; NaN stays
    a (quiet) NaN - torch's and the GPU's rounding."""
    import numpy as np

    bits32 = bits32.astype(np.uint32)
    rounded = ((bits32 + np.uint32(0x7FFF) + ((bits32 >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(
        np.uint16
    )
    nan = (bits32 & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, ((bits32 >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16), rounded)


def interpreter_skips_repeated_work() -> bool:
    """Make Triton's interpreter skip three pieces of work it repeats without effect (same results; about half
    the time of an interpreted decode step on this project's kernels):

    * re-patching ``triton.language`` at every ``@triton.jit`` helper call. A launch patches the language's
      builtins (``tl.load``, ``tl.sum``, ...) to their numpy versions and restores them when it ends; a helper
      call re-ran the same patching, which scans every member of ``tl``, ``tl.core``, ``tl.math`` and
      ``tl.tensor`` (about 2 ms) to find nothing left to patch, and dropped its record of what it set (the
      launch's restore undoes it). The kernels call helpers in their inner loops, tens of thousands of calls
      a step. A call now skips the patching when every language module its function sees is already patched
      (its ``load`` is no longer Triton's builtin); any other call patches as before.
    * rebuilding the Triton -> numpy dtype table at every element-type lookup: lookups are cached per
      element type (a block's element type, as the interpreter reads it; pointers always ask the original).
    * reducing ``xor_sum`` one element at a time: the interpreter has numpy paths for sum, min, max and
      argmin / argmax, and runs any other combine function as a Python loop over every element. ``tl.sort``
      and ``tl.topk`` (the sample kernel's candidate lists) are bitonic networks that pair elements with an
      ``xor_sum`` at every stage; integer xor is associative and commutative, so numpy's
      ``bitwise_xor.reduce`` over the axis gives the loop's result exactly.

    True when installed (idempotent); False when the interpreter's internals are not the expected ones."""
    try:
        import inspect

        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch = getattr(interpreter, "_patch_lang", None)
    scope = getattr(interpreter, "_LangPatchScope", None)
    np_dtype = getattr(interpreter, "_get_np_dtype", None)
    is_builtin = getattr(tl.core, "is_builtin", None)
    reduce_ops = getattr(interpreter, "ReduceOps", None)
    xor_combine = getattr(getattr(tl, "standard", None), "_xor_combine", None)
    if None in (patch, scope, np_dtype, is_builtin, reduce_ops, xor_combine):
        return False
    if getattr(patch, "skips_repeated_work", False):
        return True
    languages = (tl, tl.core)
    seen_by: dict = {}  # function -> the language modules among its globals (module bindings do not change)

    def patch_unless_patched(fn):
        seen = seen_by.get(fn)
        if seen is None:
            seen = seen_by[fn] = tuple(v for v in fn.__globals__.values() if inspect.ismodule(v) and v in languages)
        if seen and not any(is_builtin(lang.load) for lang in seen):
            return scope()  # the running launch patched them; its restore undoes them
        return patch(fn)

    by_element: dict = {}

    def cached_np_dtype(tt_dtype):
        element = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(element, tl.pointer_type):
            return np_dtype(tt_dtype)
        got = by_element.get(element)
        if got is None:
            got = by_element[element] = np_dtype(element)
        return got

    reduce = reduce_ops.apply_impl

    def reduce_xor_at_once(self, inputs):
        if self.combine_fn is xor_combine and len(inputs) == 1:
            (x,) = inputs
            return self.to_tensor(
                np.bitwise_xor.reduce(x.handle.data, axis=self.axis, keepdims=self.keep_dims), x.dtype
            )
        return reduce(self, inputs)

    patch_unless_patched.skips_repeated_work = True
    patch_unless_patched.original, cached_np_dtype.original, reduce_xor_at_once.original = patch, np_dtype, reduce
    interpreter._patch_lang = patch_unless_patched
    interpreter._get_np_dtype = cached_np_dtype
    reduce_ops.apply_impl = reduce_xor_at_once
    return True


def interpreter_rounds_to_nearest() -> bool:
    """Make Triton's interpreter round fp32 -> bf16 casts to nearest even, as the GPU does (it truncates:
    every rounded value would be biased towards zero by up to one bf16 ulp, and a bf16 model's error
    would grow a few times over what a GPU computes). Explicit round-toward-zero casts keep truncating.
    True when installed (idempotent); False when the interpreter's internals are not the expected ones."""
    try:
        import numpy as np
        import triton.language as tl
        from triton._C.libtriton import ir
        from triton.runtime import interpreter
    except ImportError:
        return False
    convert = getattr(interpreter, "_convert_float", None)
    if convert is None or not hasattr(ir, "ROUNDING_MODE"):
        return False
    if getattr(convert, "rounds_to_nearest", False):
        return True

    def rounding_convert(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16 and rounding_mode != ir.ROUNDING_MODE.RTZ:
            bits = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=np.uint32)
            return _bf16_round_to_nearest_even(bits).reshape(data.shape)
        return convert(data, src, dst, rounding_mode)

    rounding_convert.rounds_to_nearest = True
    interpreter._convert_float = rounding_convert
    return True
