"""Launchers, declared once: a super-op's work is a tile function; its launcher kernel is generated.

A *tile function* is a ``@triton.jit`` function whose first parameter is the tile index (and, when its
second parameter is named ``num_tiles``, the number of tiles of the launch follows). ``launcher(tile_fn)``
writes its launcher kernel: the same parameters (minus the tile index) plus ``USE_PDL``, and the body

    pid = tl.program_id(0)
    [if USE_PDL: prefetch_l2(<the program's first weight slice>)]    # declared with ``prefetch``
    pdl_wait(USE_PDL)                      # programmatic dependent launch (see below)
    tile_fn(pid, [tl.num_programs(0),] <parameters>)

so a launcher's signature is never written twice, and the megakernel calls the tile function itself
with the arguments recorded from the launcher (``declaration(launcher)`` gives it the tile function).

Multi-phase super-ops (two phases: the dense MLP, split-KV attention, the routed experts; three: AttnRes,
sampling) order kinds of tiles inside one launch. Their tile function takes ``PHASE: tl.constexpr``:
1, 2 (, 3) run one tile of that phase, 0 (what the launcher passes) runs the in-launch protocol: each
program takes a ticket (``phase_ticket``); tickets below the first phase's tile count run phase-1 tiles and
arrive (release); later tickets wait (acquire) for every arrival of the phase before theirs, then run its
tiles (``phase_done``: the last tile of the last phase puts the int32 counters back to zero for the next
launch). A program waits only on tickets taken before its own, whose programs are running: no deadlock at
any grid size, and the interpreter's sequential programs never wait. The megakernel runs the phases as
stages of its schedule instead (``phases``: their names; ``first``: the launcher arguments holding the tile
counts of the phases before the last, which has the rest of the grid).

Programmatic dependent launch (PDL, sm_90+): with ``USE_PDL`` a launch may start before its
predecessor ends; ``pdl_wait`` waits until the predecessor grid has completed and its writes are
visible, then lets this launch's own dependents start launching (they wait the same way, so starting
them early is always safe). The launch functions pass ``**pdl_launch_args(env)``.
"""

from __future__ import annotations

import inspect
import linecache
import re
import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from nonstop.kernels.platform import interpreter_rounds_to_nearest, interpreter_skips_repeated_work, interpreting
from nonstop.kernels.ptx_pass import install as install_ptx_pass

ON_GPU: tl.constexpr = tl.constexpr(not interpreting())  # PTX helpers (nanosleep, L2 prefetch): not in the interpreter
if not interpreting():  # before any kernel compiles: the Triton cache key includes the pass where it can
    install_ptx_pass()
if interpreting():
    interpreter_rounds_to_nearest()  # bf16 casts round as on the GPU (the interpreter truncates)
    interpreter_skips_repeated_work()  # same results, about 45% less time a step


# ----------------------------------------------------------------------------- PDL


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """With ``USE_PDL``: wait until the preceding grid has completed and its memory is visible, then
    allow the next grid to launch."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def pdl_launch_args(env) -> dict:
    """Launch keywords of a launcher: ``USE_PDL`` plus the executor's ``env.launch_kwargs``
    (``launch_pdl=True``) when ``env.pdl``. An env without ``pdl`` (the twins' ``StepEnv``, kernel tests)
    gives ``{"USE_PDL": False}``."""
    if not getattr(env, "pdl", False):
        return {"USE_PDL": False}
    return {"USE_PDL": True, **env.launch_kwargs}


# ----------------------------------------------------------------------------- the multi-phase protocol


@triton.jit
def spin_pause():
    """Back off between two polls of a counter (``nanosleep`` on a GPU; nothing in the interpreter)."""
    if ON_GPU:
        tl.inline_asm_elementwise("nanosleep.u32 100;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_l2(address, nbytes, LINES: tl.constexpr):
    """Request the first min(nbytes, LINES·128) bytes at ``address`` (an int64) into L2, one 128-byte line per
    lane (``prefetch.global.L2``: no register waits for it). Nothing in the interpreter, nothing for 0 bytes."""
    if ON_GPU:
        if nbytes > 0:
            offs = tl.arange(0, LINES).to(tl.int64) * 128
            lines = address + tl.where(offs < nbytes, offs, 0)
            tl.inline_asm_elementwise(
                "prefetch.global.L2 [$1];", "=r,l", [lines], dtype=tl.int32, is_pure=False, pack=1
            )


@triton.jit
def wait_at_least(counter_ptr, target):
    """Spin until ``*counter_ptr >= target``; the reads after it see what the releasing writers wrote.
    The poll is the acquire itself (its result decides the loop, so no compiler can drop it); a scalar
    atomic is issued by one thread and its value shared with the CTA through a barrier."""
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
    while seen < target:
        spin_pause()
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
    return seen


@triton.jit
def phase_ticket(count_ptr, n_first, n_second=0):
    """(phase, tile) of this program in a two- or three-phase launch: ticket t < n_first is phase-1 tile t;
    a later ticket waits until all tiles of the phase before it arrived, then is tile t - n_first of phase 2
    (three phases: t < n_first + n_second; the rest, t - n_first - n_second, phase 3).
    count_ptr: int32 [4] (tickets, then the arrivals of each phase), zero before the launch."""
    ticket = tl.atomic_add(count_ptr, 1, sem="relaxed")
    phase = 1
    tile = ticket
    if ticket >= n_first:
        if n_second > 0 and ticket >= n_first + n_second:
            wait_at_least(count_ptr + 2, n_second)
            phase = 3
            tile = ticket - n_first - n_second
        else:
            wait_at_least(count_ptr + 1, n_first)
            phase = 2
            tile = ticket - n_first
    return phase, tile


@triton.jit
def phase_done(count_ptr, phase, n_last, LAST: tl.constexpr = 2):
    """Arrive after a tile of ``phase_ticket``: a tile of an earlier phase releases its writes to the waiters;
    the last tile of the last phase (``LAST``: 2 or 3, with ``n_last`` tiles) resets the counters to zero (every
    program has taken its ticket and passed its wait by then)."""
    tl.debug_barrier()  # every thread's stores precede the arrival
    if phase < LAST:
        tl.atomic_add(count_ptr + phase, 1, sem="release")
    else:
        if tl.atomic_add(count_ptr + LAST, 1, sem="acq_rel") == n_last - 1:
            for i in tl.static_range(LAST + 1):
                tl.atomic_xchg(count_ptr + i, 0, sem="relaxed")


# ----------------------------------------------------------------------------- host-side checks


def require_unit_columns(kind: str, **tensors: torch.Tensor | None) -> None:
    """The kernels address element k of a row at row_start + k: refuse (ValueError naming the tensor) any
    given tensor whose last dimension is strided (a transposed or column-major view), which would otherwise
    be read as garbage. Row strides are the launch's to pass; ``None`` entries (absent options) are skipped."""
    for role, t in tensors.items():
        if t is not None and t.dim() and t.stride(-1) != 1:
            raise ValueError(f"{kind}: {role} needs unit column strides, got strides {tuple(t.stride())}")


# ----------------------------------------------------------------------------- workspaces

_WORKSPACES: dict = {}


def workspace(name: str, numel: int, dtype: torch.dtype, device, zero: bool = False) -> torch.Tensor:
    """A reusable flat scratch tensor of at least ``numel`` elements (grown, never shrunk), one per
    (name, device, dtype). ``zero=True`` tensors (counters) are created zeroed; the kernels that use them
    leave them at zero, so they are never cleared again. Ops sharing one must not run concurrently on a
    device. (The executors' CUDA graphs sign every workspace's address: ``cuda_graph.module_containers``.)"""
    key = (name, str(torch.device(device)), dtype)
    t = _WORKSPACES.get(key)
    if t is None or t.numel() < numel:
        with torch.inference_mode(False):  # a normal tensor: callers in and out of inference mode share it
            t = (torch.zeros if zero else torch.empty)(max(numel, 16), dtype=dtype, device=device)
        _WORKSPACES[key] = t
    return t


def phase_counters(name: str, device) -> torch.Tensor:
    """The int32 [4] zeroed counters of a two- or three-phase launcher (``phase_ticket``)."""
    return workspace(f"{name}.phases", 4, torch.int32, device, zero=True)


# ----------------------------------------------------------------------------- launchers


@dataclass(frozen=True)
class Declaration:
    """What the megakernel needs of a launcher: its tile function, whether the tile function takes
    ``num_tiles``, and the phases (names, the argument holding the phase-1 tile count)."""

    tile_fn: object
    num_tiles: bool
    phases: tuple[str, ...] = ("main",)
    first: str | tuple[str, ...] | None = None  # None: one phase

    def phase_tiles(self, args: dict, grid: int) -> list[tuple[str, int]]:
        """(phase name, tiles) of a launch with bound ``args`` and ``grid`` programs: the tile counts of every
        phase but the last are arguments (``first``: one name, or a tuple for three phases), the last phase
        has the rest of the grid."""
        names = () if self.first is None else (self.first,) if isinstance(self.first, str) else self.first
        counts = [int(args[name]) for name in names]
        return list(zip(self.phases, [*counts, grid - sum(counts)]))


DECLARATIONS: dict[object, Declaration] = {}  # launcher Python function -> its declaration


def python_function(kernel):
    """The plain Python function behind a ``JITFunction`` / ``InterpretedFunction`` / autotuner."""
    fn = kernel
    while hasattr(fn, "fn"):
        fn = fn.fn
    return fn


def declaration(launcher_fn) -> Declaration | None:
    return DECLARATIONS.get(python_function(launcher_fn))


def _param_text(p: inspect.Parameter) -> str:
    ann = p.annotation
    constexpr = ann is tl.constexpr or (isinstance(ann, str) and ann.split(".")[-1] == "constexpr")
    text = p.name + (": tl.constexpr" if constexpr else "")
    if p.default is not inspect.Parameter.empty:
        text += f" = {p.default!r}"
    return text


PDL_PREFETCH_LINES = 512  # 128-byte lines of its weight slice a PDL launch requests before its wait: 64 KiB


def launcher(
    tile_fn,
    *,
    phases: tuple[str, ...] | None = None,
    first: str | tuple[str, ...] | None = None,
    name: str | None = None,
    prefetch: tuple[str, str, str] | None = None,
):
    """The launcher kernel of ``tile_fn`` (see the module docstring); ``phases`` / ``first`` declare a
    two- or three-phase tile function (it takes ``PHASE``; ``first``: the argument(s) holding the tile counts
    of the phases before the last). ``prefetch`` = (weight pointer, first element, elements):
    expressions over the launcher's parameters and ``pid`` (the program id) naming the contiguous weight slice
    a program streams first; with PDL its first ``PDL_PREFETCH_LINES`` lines are requested into L2 before the
    wait (weights depend on no predecessor). Returns a ``JITFunction`` (``InterpretedFunction`` under the
    interpreter) named ``name`` (default ``<tile function>_kernel``)."""
    fn = python_function(tile_fn)
    params = list(inspect.signature(fn).parameters.values())
    takes_num_tiles = len(params) > 1 and params[1].name == "num_tiles"
    own = params[2 if takes_num_tiles else 1 :]
    if phases is not None and not any(p.name == "PHASE" for p in own):
        raise TypeError(f"{fn.__name__}: a multi-phase tile function takes PHASE: tl.constexpr")
    name = name or f"{fn.__name__.removesuffix('_tile')}_kernel"
    signature = [_param_text(p) for p in own if p.name != "PHASE"] + ["USE_PDL: tl.constexpr = False"]
    call = (
        ["pid"]
        + (["tl.num_programs(0)"] if takes_num_tiles else [])
        + [("0" if p.name == "PHASE" else p.name) for p in own]
    )
    body = ["pid = tl.program_id(0)"]
    if prefetch is not None:
        ptr, first_el, count = prefetch
        first_el = re.sub(r"\bpid\b", "pid.to(tl.int64)", first_el)  # element offsets of large weights pass 2^31
        body += [
            "if USE_PDL:  # the weight slice depends on no predecessor: in flight before the wait",
            f"    prefetch_l2(({ptr} + ({first_el})).to(tl.int64), ({count}) * "
            f"({ptr}.dtype.element_ty.primitive_bitwidth // 8), "
            f"{PDL_PREFETCH_LINES})",
        ]
    body += ["pdl_wait(USE_PDL)", f"tile_fn({', '.join(call)})"]
    source = (
        f"import triton\nimport triton.language as tl\nfrom {fn.__module__} import {fn.__name__} as tile_fn\n"
        "from nonstop.kernels.launch import pdl_wait, prefetch_l2\n\n\n"
        f"@triton.jit\ndef {name}({', '.join(signature)}):\n" + "".join(f"    {line}\n" for line in body)
    )
    module_name = f"{fn.__module__}.__launchers__.{name}"
    filename = f"<nonstop launcher {module_name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # what inspect.getsource reads
    namespace = {"__name__": module_name}
    exec(compile(source, filename, "exec"), namespace)
    kernel = namespace[name]
    first = tuple(first) if isinstance(first, list) else first
    DECLARATIONS[python_function(kernel)] = Declaration(tile_fn, takes_num_tiles, tuple(phases or ("main",)), first)
    sys.modules.setdefault(module_name, type(sys)(module_name)).__dict__.update(namespace)
    return kernel
