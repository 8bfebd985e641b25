"""Generate the persistent megakernel's Triton source for a set of task classes.

A *task class* is one stage body called with one set of compile-time facts: the constexpr values of
its launcher, the dtype of each pointer, and the scalar arguments that are equal in every op instance
of the class (baked in as constants, so the compiler sees e.g. strides as numbers). Everything that
differs between instances (other layers' weights, caches, scalars) is read at run time from tables:

  ptrs    int64 [I, MAX_P]  addresses; cast in the kernel with ``.to(tl.pointer_type(dtype))``
  wptrs   int64 [I, MAX_W]  the addresses of the op's weights (apart: the offline check follows them)
  ints    int64 [I, MAX_S]  integer scalars (cast to int32 where the launcher would pass int32)
  floats  fp32  [I, MAX_S]  float scalars
  (I = op instances; an instance is one recorded launch.)

Generated code, per class k (``opcode`` k):

    elif opcode == k:
        ak_x = tl.multiple_of(tl.load(ptrs_ptr + inst * MAX_P + 0).to(tl.pointer_type(tl.float16)), 16)
        ak_n = tl.full([], 4096, tl.int32)                    # uniform scalar
        ak_eps = tl.load(floats_ptr + inst * MAX_S + 0)       # per-instance scalar
        body_k(tile, ak_x, ak_n, ak_eps, ..., 64, ...)   # constexprs as literals, PHASE of the stage
(pointers 16-byte aligned in every instance, and per-instance integers divisible by 16, carry
``tl.multiple_of`` hints: what Triton's launcher specialisation would have told the compiler).

A class's body is its launcher's tile function (``nonstop.kernels.launch.declaration``), called with
the task's tile, the recorded arguments by parameter name, and ``PHASE`` = its stage's phase for the
multi-phase super-ops.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys

import torch

from nonstop.cache_dirs import private_dir
from nonstop.kernels.launch import python_function

TORCH_TO_TL = {
    torch.float32: "tl.float32",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64",
    torch.int8: "tl.int8",
    torch.uint8: "tl.uint8",
    torch.int16: "tl.int16",
    torch.int32: "tl.int32",
    torch.int64: "tl.int64",
    torch.bool: "tl.int1",
    torch.float8_e4m3fn: "tl.float8e4nv",
    torch.float8_e5m2: "tl.float8e5",
}

_MODULES: dict[str, object] = {}


def load_source(prefix: str, source: str):
    """Import generated ``source`` as a module. It is written to a file because Triton reads a kernel's
    source from it: ``cache_dirs.private_dir("megakernel")``, which only this user can write, and the file
    is rewritten unless it holds exactly ``source`` (a file of that name is never trusted as it is)."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    name = f"_nonstop_mk_{prefix}_{digest}"
    if name in _MODULES:
        return _MODULES[name]
    path = private_dir("megakernel") / f"{name}.py"
    if not path.is_file() or path.read_text() != source:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _MODULES[name] = module
    return module


def is_constexpr(param: inspect.Parameter) -> bool:
    ann = param.annotation
    if isinstance(ann, str):
        return ann.split(".")[-1] == "constexpr"
    return getattr(ann, "__name__", "") == "constexpr"


def const_literal(value) -> str:
    """Source text of a constexpr value."""
    if type(value).__name__ == "constexpr":
        value = value.value
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value)
    name = getattr(value, "name", None)
    if name is not None and type(value).__module__.startswith("triton"):  # a tl.dtype
        return {
            "fp32": "tl.float32",
            "fp16": "tl.float16",
            "bf16": "tl.bfloat16",
            "fp64": "tl.float64",
            "fp8e4nv": "tl.float8e4nv",
            "fp8e5": "tl.float8e5",
        }.get(name, f"tl.{name}")
    raise ValueError(f"cannot write constexpr {value!r} into generated source")


def int_type(values) -> str:
    return "tl.int32" if all(-(2**31) <= v < 2**31 for v in values) else "tl.int64"


def megakernel_source(classes: list, max_p: int, max_w: int, max_s: int) -> str:
    """Source of ``megakernel`` dispatching on ``opcode`` to ``classes`` (``plan.TaskClass``); the kernel loop
    is ``KERNEL`` below (see ``kernel.py`` for the protocol). Each class is a function of its own, not inlined
    (``task_k``): the compiler allocates each class's registers apart, so the kernel needs the registers of
    its largest class, not of all their bodies merged into one."""
    imports, branches, functions = {}, [], []
    tables = {"ptr": ("ptrs_ptr", max_p), "wptr": ("wptrs_ptr", max_w)}
    for k, cls in enumerate(classes):
        fn = python_function(cls.body)
        alias = f"body_{k}"
        imports[alias] = (fn.__module__, fn.__name__)
        lines, value_of = [], {}
        for p in cls.params:
            if p.name == "USE_PDL":  # the launcher's own wait: the megakernel orders tasks by its counters
                continue
            if p.kind == "const":
                value_of[p.name] = const_literal(p.value)
                continue
            var = f"a{k}_{p.name}"  # unique per branch: Triton merges same-named values of if/else branches
            if p.kind in tables:
                table, width = tables[p.kind]
                value = f"tl.load({table} + inst * {width} + {p.slot}).to(tl.pointer_type({p.dtype}))"
            elif p.kind == "none":
                value = "None"
            elif p.kind == "int" and p.uniform:
                value = f"tl.full([], {p.value}, {p.dtype})"
            elif p.kind == "int":
                value = f"tl.load(ints_ptr + inst * {max_s} + {p.slot}).to({p.dtype})"
            elif p.kind == "float" and p.uniform:
                value = f"tl.full([], {float(p.value)!r}, tl.float32)"
            else:
                value = f"tl.load(floats_ptr + inst * {max_s} + {p.slot})"
            if p.align16:  # what Triton's launcher would have told the compiler (16-byte aligned / divisible)
                value = f"tl.multiple_of({value}, 16)"
            lines.append(f"{var} = {value}")
            value_of[p.name] = var
        own = list(inspect.signature(fn).parameters)[2 if cls.num_tiles else 1 :]
        args = (
            ["tile"]
            + (["ntiles"] if cls.num_tiles else [])
            + [str(cls.phase) if n == "PHASE" else value_of[n] for n in own]
        )
        lines.append(f"{alias}({', '.join(args)})")
        task_args = "tile, ntiles, inst, ptrs_ptr, wptrs_ptr, ints_ptr, floats_ptr"
        functions.append(
            f"@triton.jit(noinline=True)\ndef task_{k}({task_args}):\n"
            f'    """{cls.label}"""\n' + "".join(f"    {ln}\n" for ln in lines)
        )
        head = "if" if k == 0 else "elif"
        branches.append(f"        {head} opcode == {k}:\n            task_{k}({task_args})\n")
    import_text = "".join(f"from {mod} import {name} as {alias}\n" for alias, (mod, name) in imports.items())
    return KERNEL.format(
        n=len(classes), imports=import_text, functions="\n\n".join(functions), branches="".join(branches)
    )


KERNEL = '''"""Generated persistent megakernel ({n} task classes). See nonstop/runtime/megakernel/kernel.py."""
import triton
import triton.language as tl
from nonstop.kernels.launch import prefetch_l2, wait_at_least
{imports}

{functions}

@triton.jit(noinline=True)
def prefetch_task(prefetch_ptr, task, LINES: tl.constexpr):
    """Request the first weight lines of ``task`` (address, bytes in the prefetch table) into L2. Not inlined:
    its per-lane line offsets would otherwise be hoisted out of the task loop and held across every task call."""
    prefetch_l2(tl.load(prefetch_ptr + task * 2), tl.load(prefetch_ptr + task * 2 + 1), LINES)


@triton.jit(do_not_specialize=["num_steps"])  # one compile for one and several steps a launch
def megakernel(tasks_ptr, waits_ptr, prefetch_ptr, counters_ptr, ticket_ptr, state_ptr, ptrs_ptr, wptrs_ptr, ints_ptr,
               floats_ptr, num_tasks, num_steps, NUM_FIELDS: tl.constexpr, PREFETCH_LINES: tl.constexpr):
    # its PTX goes through nonstop/kernels/ptx_pass.py (predicated shared loads defined: no spill in task functions)
    first_step = tl.load(state_ptr)  # advanced by the previous launch's last program
    base = first_step * num_tasks  # tickets of this launch: base .. end - 1 (int64: they grow launch after launch)
    end = base + num_steps * num_tasks
    q = tl.atomic_add(ticket_ptr, 1, sem="relaxed")
    if q < end:
        prefetch_task(prefetch_ptr, (q - base).to(tl.int32) % num_tasks, PREFETCH_LINES)
    while q < end:
        rel = (q - base).to(tl.int32)  # int32 within a launch: no 64-bit division in the loop
        step = first_step + rel // num_tasks
        rec = tasks_ptr + (rel % num_tasks) * NUM_FIELDS
        opcode = tl.load(rec + 0)
        inst = tl.load(rec + 1).to(tl.int64)
        tile = tl.load(rec + 2)
        ntiles = tl.load(rec + 3)
        counter = tl.load(rec + 4)
        wait_begin = tl.load(rec + 5)
        wait_end = tl.load(rec + 6)
        # 1. every wait's counter reached its target for this step (counters only grow); the poll is the
        #    acquire, so this task's reads follow the producers' released writes
        for w in range(wait_begin, wait_end):
            target = step * tl.load(waits_ptr + w * 3 + 2) + tl.load(waits_ptr + w * 3 + 1)
            wait_at_least(counters_ptr + tl.load(waits_ptr + w * 3), target)
        # 2. the next ticket, and its first weight lines in flight, before this task's body runs
        q_next = tl.atomic_add(ticket_ptr, 1, sem="relaxed")
        if q_next < end:
            prefetch_task(prefetch_ptr, (q_next - base).to(tl.int32) % num_tasks, PREFETCH_LINES)
        # 3. the tile
{branches}
        # 4. release: this tile's writes are visible before the counter moves
        tl.debug_barrier()
        tl.atomic_add(counters_ptr + counter, 1, sem="release")
        q = q_next
    # undo the ticket this program took past the end, so the queue ends at exactly end
    tl.atomic_add(ticket_ptr, -1, sem="relaxed")
    # the last program out moves the step on (every program read first_step before it could get here)
    if tl.atomic_add(state_ptr + 1, 1, sem="acq_rel") == tl.num_programs(0) - 1:
        tl.store(state_ptr, first_step + num_steps)
        tl.atomic_xchg(state_ptr + 1, 0, sem="relaxed")
'''
