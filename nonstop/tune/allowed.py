"""What a candidate kernel file may name: allow-lists, one table per namespace (``static_check`` applies them).

Everything a candidate can reach is listed here; a name that is not listed is rejected, so a module's
other attributes (``typing.sys``, ``triton.runtime``, ``math.__loader__``, ``tl.core``) and any object that
leads back to the interpreter (modules, frames, globals, importers) stay out of reach:

* ``MODULES``: per importable module, the names a candidate may use from it (``import M`` / ``from M
  import n`` / ``M.n``); a name that is itself a module of the table continues the chain (``torch.cuda``,
  ``tl.extra.cuda``), any other is a leaf: no attribute after it, except the ``DTYPE_ATTRS`` of a dtype;
* ``HOST_BUILTINS``: the builtins host code may call; ``KERNEL_BUILTINS`` / ``KERNEL_ATTRS``: the builtins a
  Triton kernel may use and the attributes it may read on its values;
* ``HOST_ATTRS``: attributes host code may read on the objects a launch gets (the op, the env, its
  buffers, caches and batch, configs, tensors' metadata and views, dict and string reads, device facts);
  the methods that compute, copy, reach storage or change an object (``copy_``, ``data_ptr``,
  ``storage_offset``, ``append``, ``add_module``, ``register_*``, ``format`` ...) are not among them;
* ``kernel_helpers()``: the host functions of ``nonstop.kernels`` a candidate may call: the built-in
  launchers and the helpers they call (Triton kernels and constant tables of ``nonstop.kernels`` are
  always allowed); never ``launcher`` (it compiles source text).

No memory a candidate can reach keeps a value from one call to the next, so no candidate can count its
calls (right for the verifier's twenty, wrong from the thousandth on): scratch is allocated zeroed
(``torch.zeros``: ``torch.empty`` may hand back the bytes the previous call left, which the executor's
allocator does step after step), the persistent ``workspace`` scratch and the helpers that return it are
out of reach, and the two-phase counters (``phase_counters``) must be back at zero after every call (the
child checks).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap

DTYPES = frozenset(
    """
    bfloat16 bool double float float16 float32 float64 float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz
    float8_e8m0fnu half int int16 int32 int64 int8 long short uint16 uint32 uint64 uint8
""".split()
)
TL_DTYPES = frozenset(
    """
    bfloat16 float16 float32 float64 float8e4b15 float8e4b8 float8e4nv float8e5 float8e5b16 int1 int16 int32 int64
    int8 uint16 uint32 uint64 uint8
""".split()
)
TL_NAMES = TL_DTYPES | frozenset(
    """
    PropagateNan TRITON_MAX_TENSOR_NUMEL abs add advance arange argmax argmin associative_scan assume atomic_add
    atomic_and atomic_cas atomic_max atomic_min atomic_or atomic_xchg atomic_xor block_type broadcast broadcast_to
    cast cat cdiv ceil clamp constexpr cos cumprod cumsum debug_barrier div_rn dot dot_scaled dtype erf exp exp2
    expand_dims extra fdiv flip floor fma full gather histogram interleave join load load_tensor_descriptor log
    log2 make_block_ptr make_tensor_descriptor max max_constancy max_contiguous maximum min minimum mul
    multiple_of num_programs pair_uniform_to_normal permute philox pointer_type program_id rand randint randn range
    ravel reduce reshape rsqrt sigmoid sin softmax sort split sqrt sqrt_rn squeeze static_assert static_range store
    store_tensor_descriptor sub sum swizzle2d tensor topk trans umulhi unsqueeze view void where xor_sum zeros
    zeros_like
""".split()
)
MATH_NAMES = frozenset(
    """
    acos acosh asin asinh atan atan2 atanh cbrt ceil comb copysign cos cosh degrees dist e erf erfc exp exp2 expm1
    fabs factorial floor fmod frexp fsum gamma gcd hypot inf isclose isfinite isinf isnan isqrt lcm ldexp lgamma
    log log10 log1p log2 modf nan nextafter perm pi pow prod radians remainder sin sinh sqrt tan tanh tau trunc ulp
""".split()
)
# the torch allocators a candidate may call: zeroed memory only (no torch.empty: see the module docstring)
TORCH_ALLOCATORS = frozenset({"zeros", "zeros_like"})
TORCH_FACTS = frozenset("device dtype Size Tensor finfo iinfo".split())  # types and dtype facts
MODULES: dict[str, frozenset[str]] = {
    "torch": DTYPES | TORCH_ALLOCATORS | TORCH_FACTS | {"cuda"},
    "torch.cuda": frozenset(
        "current_device device_count get_device_capability get_device_name get_device_properties is_available".split()
    ),
    "triton": frozenset({"cdiv", "jit", "language", "next_power_of_2"}),
    "triton.language": TL_NAMES,
    "triton.language.extra": frozenset({"cuda"}),
    "triton.language.extra.cuda": frozenset({"gdc_launch_dependents", "gdc_wait"}),  # PDL (launch.pdl_wait)
    "math": MATH_NAMES,
    "typing": frozenset(
        "Any Callable Dict Final Iterable List Mapping Optional Sequence Tuple TYPE_CHECKING Union".split()
    ),
    "__future__": frozenset({"annotations"}),
}
# after a dtype leaf (torch.float32.itemsize, tl.float32.primitive_bitwidth)
DTYPE_ATTRS = frozenset(
    """
    fp_mantissa_width int_bitwidth is_bf16 is_complex is_floating is_floating_point is_fp16 is_fp32 is_fp64 is_fp8
    is_int is_int_signed is_int_unsigned is_signed itemsize primitive_bitwidth
""".split()
)

HOST_BUILTINS = frozenset(
    """
    abs all any bool dict divmod enumerate float frozenset int isinstance len list max min range reversed round set
    slice sorted str sum tuple zip AssertionError IndexError KeyError NotImplementedError RuntimeError TypeError
    ValueError
""".split()
)
KERNEL_BUILTINS = frozenset({"range", "min", "max", "len", "abs", "int", "float", "bool", "tuple", "isinstance"})
# attributes a Triton kernel may use on its values (tensors, pointers, dtypes, constexprs); under the CPU
# interpreter kernel bodies run as Python, so nothing else (e.g. a NumPy handle's file methods) is reachable
KERNEL_ATTRS = frozenset(
    """
    T abs argmax argmin associative_scan atomic_add atomic_and atomic_cas atomic_max atomic_min atomic_or
    atomic_xchg atomic_xor broadcast_to cast cdiv ceil cos cumprod cumsum dtype element_ty erf exp exp2 expand_dims
    flip floor fp_mantissa_width gather histogram int_bitwidth is_bf16 is_block is_bool is_floating is_fp16 is_fp32
    is_fp64 is_fp8 is_int is_int1 is_int16 is_int32 is_int64 is_int8 is_int_signed is_int_unsigned is_ptr
    is_standard_floating is_uint16 is_uint32 is_uint64 is_uint8 kind log log2 logical_and logical_or max min numel
    permute primitive_bitwidth ravel reduce reshape rsqrt scalar shape sigmoid sin softmax sort split sqrt sqrt_rn
    sum to trans type value view with_element_ty xor_sum
""".split()
)

# host attributes: the launch's objects (op, env, batch, caches, pages), tensor metadata and views, reads of
# dicts and strings, device properties; config fields come from nonstop.config's dataclasses (``host_attrs``)
HOST_ATTRS = frozenset(
    """
    attrs kind layer name reads weights writes
    B T batch buf cache seq
    keep_states slots start
    conv fit_pool history_conv history_for history_recurrent layers page_size pages recurrent table tensors
    T device dim dtype element_size expand flatten is_contiguous is_cuda is_floating_point itemsize mT movedim narrow
    nbytes ndim new_zeros numel permute reshape select shape size squeeze stride transpose unflatten unsqueeze
    view view_as
    get items keys values
    endswith join lower removeprefix removesuffix startswith upper
    L2_cache_size index major max_shared_memory_per_block_optin minor multi_processor_count
    regs_per_multiprocessor shared_memory_per_block shared_memory_per_block_optin shared_memory_per_multiprocessor
    total_memory type warp_size
    bit_length value
""".split()
)


@functools.cache
def host_attrs() -> frozenset[str]:
    """``HOST_ATTRS`` plus the fields of every nonstop.config dataclass (``op.attrs["moe"].top_k`` ...)."""
    from nonstop import config

    fields = set()
    for obj in vars(config).values():
        if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and obj.__module__.startswith("nonstop."):
            fields |= {f.name for f in dataclasses.fields(obj) if not f.name.startswith("_")}
    return HOST_ATTRS | frozenset(fields)


NEVER_HELPERS = ("launcher", "workspace")  # compiles source text / state that outlives a call
ZEROED_HELPERS = ("phase_counters",)  # persistent, but checked to be zero after every call


def returns_workspace(fn) -> bool:
    """True for a nonstop.kernels function whose body names ``workspace`` (it hands out persistent scratch)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError):
        return False
    return any(isinstance(n, ast.Name) and n.id == "workspace" for n in ast.walk(tree))


@functools.cache
def kernel_helpers() -> frozenset[int]:
    """ids of the host functions of nonstop.kernels a candidate may call: every built-in launcher (the
    ``KERNELS`` tables) and the plain functions of nonstop.kernels its body names, except those that hand
    out persistent scratch (``returns_workspace``; ``phase_counters`` is allowed: its counters are checked)."""
    from nonstop.kernels import KERNELS
    from nonstop.kernels import launch as launch_module

    never = {id(getattr(launch_module, n)) for n in NEVER_HELPERS}
    out = set()
    for fn in KERNELS.values():
        out.add(id(fn))
        module = inspect.getmodule(fn)
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                obj = getattr(module, node.id, None)
                if inspect.isfunction(obj) and (obj.__module__ or "").startswith("nonstop.kernels."):
                    if obj.__name__ in ZEROED_HELPERS or not returns_workspace(obj):
                        out.add(id(obj))
    return frozenset(out - never)


def path_problem(parts: list[str]) -> str | None:
    """Why the dotted name ``parts`` (``["triton", "language", "sum"]``) is out of reach, or None."""
    module = parts[0]
    if module not in MODULES:
        return f"{module} is not an allowed module"
    i = 1
    while i < len(parts):
        name = parts[i]
        if name not in MODULES[module]:
            return f"{module}.{name} is not allowed (allowed from {module}: {', '.join(sorted(MODULES[module]))})"
        i += 1
        if f"{module}.{name}" in MODULES:
            module = f"{module}.{name}"
            continue
        rest = parts[i:]
        dtype = name in DTYPES if module == "torch" else name in TL_DTYPES and module == "triton.language"
        if rest and not (dtype and len(rest) == 1 and rest[0] in DTYPE_ATTRS):
            return f"{'.'.join(parts)}: nothing may follow {module}.{name}"
        return None
    return f"the module {module} may only start an attribute chain (modules are not values)"
