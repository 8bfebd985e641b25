"""Compile a kernel launch for a GPU without one, and read what that GPU would get.

``compile_launch(fn, args, options)`` compiles a ``@triton.jit`` kernel exactly as its launch would on an
sm_90 GPU - the same binder, the same specialisation of every argument (16-byte alignment of pointers,
divisibility of integers), the same launch options - through a stand-in driver (``offline_target``): no
GPU, no launch. Tensors may live on the meta device (their ``data_ptr`` is their byte offset, so views
keep their alignment). Triton must not be in interpreter mode in this process.

``inspect(kernel, weights, target)`` reads the result:
  registers, spill bytes (ptxas -v on the kernel's PTX, the ptxas and options Triton used),
  shared memory, CTAs per SM (``platform.Target.occupancy``),
  ``loads``: per loop of the LLVM IR that loads a weight (a pointer derived from an argument named in
  ``weights``), the widths in bytes of those loads (16 = ``ld.global.v4.b32``; cp.async counts as its size);
  the same for side streams (MXFP4 scales), which may be narrow but must not issue more loads than the
  weights they scale,
  ``spins``: per loop of the PTX that polls global memory (an atomic or a volatile / acquire load inside
  the loop), whether an acquire orders what follows (the poll itself is an acquire, or one follows the
  loop before any other global load).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

from nonstop.cache_dirs import cache_root
from nonstop.kernels.platform import H100, Target


class _OfflineDriver:
    """The part of Triton's driver that compiling needs: a current device, stream and target."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target


@contextlib.contextmanager
def offline_target(arch: int = 90):
    """Within the block Triton compiles for sm_<arch> (launches are not possible)."""
    from triton.runtime.driver import driver

    before = driver._active  # None until a real driver was needed (there is none without a GPU)
    driver.set_active(_OfflineDriver(arch))
    try:
        yield
    finally:
        driver._active = before


def compile_launch(fn, args: dict, options: dict, arch: int = 90):
    """The ``CompiledKernel`` a launch of ``fn`` with ``args`` (by parameter name) and launch ``options``
    (num_warps, num_stages, ...) would run on sm_<arch>; and the kernel's runtime parameter names in the
    order of its LLVM function's arguments."""
    options = {k: v for k, v in options.items() if k != "launch_pdl"}  # a launch attribute, not a compile option
    with offline_target(arch):
        kernel = fn.warmup(grid=(1,), **args, **options)
        _, _, _, backend, binder = fn.device_caches[0]
        bound, specialization, opts = binder(**args, **options)
        _, signature, _, _ = fn._pack_args(backend, dict(options), bound, specialization, opts)
    names = [name for name, ty in signature.items() if ty != "constexpr"]
    return kernel, names


# ----------------------------------------------------------------------------- ptxas


def _cache_dir() -> str:
    path = cache_root() / "ptxas"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def ptxas_usage(ptx: str, arch: int = 90, fp_fusion: bool = True) -> dict:
    """{registers, spill_store_bytes, spill_load_bytes, stack_bytes} that the ptxas shipped with Triton
    reports for ``ptx`` with Triton's options (cached by the PTX's hash)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    ptxas = get_ptxas(arch).path
    cmd_tail = [
        "-v",
        "-lineinfo",
        *([] if fp_fusion else ["--fmad=false"]),
        f"--gpu-name={sm_arch_from_capability(arch)}",
    ]
    key = hashlib.sha256(("usage v2" + ptx + ptxas + " ".join(cmd_tail)).encode()).hexdigest()[:32]
    cached = os.path.join(_cache_dir(), key + ".json")
    if os.path.exists(cached):
        with open(cached) as f:
            return json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run([ptxas, *cmd_tail, src, "-o", os.path.join(tmp, "k.o")], capture_output=True, text=True)
    text = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"ptxas failed:\n{text[-2000:]}")
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", text)]
    spills = [(int(a), int(b)) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)]
    stack = [int(x) for x in re.findall(r"(\d+) bytes stack frame", text)]
    # every function of the module (the kernel and its non-inlined callees): the most registers, all spills
    usage = {
        "registers": max(regs) if regs else None,
        "spill_store_bytes": sum(a for a, _ in spills),
        "spill_load_bytes": sum(b for _, b in spills),
        "stack_bytes": max(stack, default=0),
    }
    with open(cached + f".{os.getpid()}", "w") as f:
        json.dump(usage, f)
    os.replace(cached + f".{os.getpid()}", cached)
    return usage


def function_registers(cubin: bytes, arch: int = 90) -> dict[str, int]:
    """{function: registers it touches (its highest register + 1)} of every function of a compiled module -
    the kernel and its non-inlined callees (the megakernel's ``task_k``), read from the SASS (``nvdisasm``
    shipped with Triton): ptxas reports registers and spills for the whole call graph of a kernel only, so
    this is how a spill is traced to the function that needs the registers."""
    from triton.backends.nvidia.compiler import get_ptxas

    nvdisasm = os.path.join(os.path.dirname(get_ptxas(arch).path), "nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True).stdout
    out: dict[str, int] = {}
    fn = None
    for line in sass.splitlines():
        label = re.match(r"^([^\s.][^\s]*):\s*$", line)
        if label:
            fn = label.group(1)
            out.setdefault(fn, 0)
        elif fn is not None and "/*" in line:
            out[fn] = max([out[fn], *(int(r) + 1 for r in re.findall(r"\bR(\d+)\b", line))])
    return out


# ----------------------------------------------------------------------------- LLVM IR: weight loads in loops

_DEF = re.compile(r"^\s*(%[\w.]+)\s*=\s*(.*)$")
_LABEL = re.compile(r"^([\w.]+):")


@dataclass
class LoopLoads:
    """The weight loads of one loop: (width in bytes, source location) per load, by weight parameter."""

    header: str
    widths: dict[str, list[tuple[int, str]]] = field(default_factory=dict)


def _locations(llir: str):
    """!dbg id -> "file.py:line" of the innermost (inlined) source location."""
    meta = dict(re.findall(r"^(![0-9]+) = (.*)$", llir, flags=re.M))

    def where(ref: str) -> str:
        loc = meta.get(ref, "")
        line = re.search(r"line: (\d+)", loc)
        scope = re.search(r"scope: (![0-9]+)", loc)
        text, seen = meta.get(scope.group(1), "") if scope else "", 0
        while "file:" not in text and seen < 20:
            nxt = re.search(r"scope: (![0-9]+)", text)
            text, seen = (meta.get(nxt.group(1), "") if nxt else ""), seen + 1
        f = re.search(r"file: (![0-9]+)", text)
        name = re.search(r'filename: "([^"]+)"', meta.get(f.group(1), "")) if f else None
        return f"{name.group(1) if name else '?'}:{line.group(1) if line else '?'}"

    return where


def _functions(llir: str) -> dict[str, tuple[list[str], list[str]]]:
    """{function name: (argument SSA names in order, body lines)} of every ``define`` of the module."""
    lines = llir.splitlines()
    out = {}
    for i, line in enumerate(lines):
        if not line.startswith("define"):
            continue
        name = re.search(r'@("[^"]+"|[\w.$]+)\(', line).group(1).strip('"')
        head = line[line.index("(") + 1 : line.rindex(")")]
        args = [a.split()[-1] for a in re.split(r",\s*(?![^()]*\))", head) if a.strip() and "%" in a]
        body = []
        for rest in lines[i + 1 :]:
            if rest.startswith("}"):
                break
            body.append(rest)
        out[name] = (args, body)
    return out


def _load_width(text: str) -> int | None:
    """Bytes one global load instruction moves, from its inline PTX or LLVM type; None if not a global load.
    ``text``: the instruction, with or without the ``%v =`` it defines (``weight_loop_loads`` passes it without)."""
    if "cp.async" in text:  # the copy size operand, hex or decimal (PTX ISA: cp.async cp-size 4, 8 or 16)
        m = re.search(r"cp\.async\.\w+\.shared(?:::cta)?\.global[^,]*,[^,]*,\s*(0x[0-9a-fA-F]+|\d+)\b", text)
        return int(m.group(1), 0) if m else 16
    # qualifiers before the type may carry ``::`` (cache hints: ``.L1::evict_first``, ``.L2::128B``)
    # the state space follows ``.volatile`` / ``.relaxed.<scope>`` / ``.acquire.<scope>`` (PTX ISA ``ld``); the
    # opcode may follow a digit: LLVM IR writes the asm string's newline and tab as ``\0A\09``
    m = re.search(
        r"(?<![A-Za-z_.])ld(?:\.(?:weak|volatile|mmio\.relaxed|relaxed|acquire)(?:\.(?:cta|cluster|gpu|sys))?)?\.global(?:\.[\w:]+)*?\.(v\d)?\.?([bfsu])(\d+)\b",
        text,
    )
    if m:
        lanes = int(m.group(1)[1:]) if m.group(1) else 1
        return lanes * int(m.group(3)) // 8
    m = re.search(r"(?:^|=)\s*load\s+(?:volatile\s+)?(<(\d+) x (\w+)>|\w+),\s*ptr addrspace\(1\)", text)
    if m:
        if m.group(2):
            return int(m.group(2)) * _bits(m.group(3)) // 8
        return _bits(m.group(1)) // 8
    return None


def _bits(ty: str) -> int:
    return {"half": 16, "bfloat": 16, "float": 32, "double": 64, "ptr": 64}.get(
        ty, int(ty[1:]) if ty[1:].isdigit() else 32
    )


_FOLLOW = (
    "getelementptr",
    "phi",
    "select",
    "bitcast",
    "addrspacecast",
    "inttoptr",
    "ptrtoint",
    "add",
    "or",
    "sub",
    "mul",
    "shl",
    "sext",
    "zext",
    "trunc",
    "extractvalue",
    "insertelement",
    "extractelement",
    "shufflevector",
    "and",
)


class _Function:
    """One function of the LLVM IR: its definitions, instructions, blocks, loops (a block range closed by a branch
    back)."""

    def __init__(self, args: list[str], body: list[str]):
        self.args = args
        self.defs, order, branches = {}, ["entry"], []
        # (block, instruction without the ``%v =`` it defines) of every instruction: a load that defines no value
        # (the inline-asm ``cp.async`` of a pipelined loop returns void) is a load all the same
        self.instructions: list[tuple[str, str]] = []
        self.calls: list[tuple[str, list[str]]] = []  # (callee, operand SSA names)
        block = "entry"
        for line in body:
            lab = _LABEL.match(line)
            if lab:
                block = lab.group(1)
                order.append(block)
                continue
            d = _DEF.match(line)
            if d:
                self.defs[d.group(1)] = d.group(2)
            if line.strip():
                self.instructions.append((block, d.group(2) if d else line.strip()))
            if re.match(r"\s*br\b", line):
                branches.append((block, re.findall(r"label %([\w.]+)", line)))
            call = re.search(r'call [^@]*@("[^"]+"|[\w.$]+)\((.*)\)', line)
            if call:
                operands = [o.split()[-1] for o in re.split(r",\s*(?![^()]*\))", call.group(2)) if o.strip()]
                self.calls.append((call.group(1).strip('"'), operands))
        position = {b: i for i, b in enumerate(order)}
        self.order = order
        latches: dict[int, int] = {}  # a loop per header: several branches back to one header close one loop
        for src, targets in branches:
            for t in targets:
                if t in position and position[t] <= position[src]:
                    latches[position[t]] = max(latches.get(position[t], -1), position[src])
        self.loops = sorted(latches.items())


_ROOT_PASSES = 16  # passes to the roots' fixpoint; a pointer loaded from itself (a list walk) never settles


def weight_loop_loads(llir: str, arg_names: list[str], weights: set[str], name: str | None = None) -> list[LoopLoads]:
    """Per loop of any function of the module (a block range closed by a branch back) that loads from a
    weight argument of the kernel: the load widths, by argument. Pointers are followed back through
    getelementptr, phi, select, casts and integer arithmetic, into the callers of non-inlined functions
    (a parameter is what the call sites pass); a pointer loaded from memory is followed into the address it
    was loaded from (``*table``: loaded from the table argument ``table``)."""
    funcs = {n: _Function(*parts) for n, parts in _functions(llir).items()}
    kernel = (
        name if name in funcs else next((n for n in funcs if "ptx_kernel" in _define_line(llir, n)), next(iter(funcs)))
    )
    callers: dict[str, list[tuple[str, list[str]]]] = {}
    for n, f in funcs.items():
        for callee, operands in f.calls:
            callers.setdefault(callee, []).append((n, operands))
    # roots of each (function, value), grown pass by pass to a fixpoint: a value on a cycle (a pointer phi and
    # the getelementptr that feeds it back) is met again while its own roots are still being found, and takes
    # the last pass's answer for it then; one pass alone would keep what the cycle's other values got from
    # that partial answer
    known: dict[tuple[str, str], set[str]] = {}
    memo: dict[tuple[str, str], set[str]] = {}

    def roots(fn: str, v: str, depth: int = 0) -> set[str]:
        f = funcs[fn]
        if v in f.args:
            i = f.args.index(v)
            if fn == kernel:
                return {arg_names[i]} if i < len(arg_names) else set()
            return set().union(*[roots(c, ops[i], depth + 1) for c, ops in callers.get(fn, []) if i < len(ops)])
        key = (fn, v)
        if key in memo or depth > 400:
            return memo.get(key, known.get(key, set()))
        memo[key] = known.get(key, set())
        text = f.defs.get(v, "")
        out: set[str] = set()
        if (
            "asm" in text
            and re.search(r"(?<![A-Za-z_.])ld(\.\w+)*\.global", text)
            or (text.startswith("load") and "addrspace(1)" in text)
        ):
            for p in re.findall(r"ptr addrspace\(1\) (%[\w.]+)", text):  # loaded from memory: where from
                out |= {f"*{r}" for r in roots(fn, p, depth + 1)}
        elif text.startswith(_FOLLOW) or "asm" in text:
            for operand in re.findall(r"%[\w.]+", text):
                out |= roots(fn, operand, depth + 1)
        memo[key] = out
        return out

    loads = []  # (function, loop head, load width, where, the pointer it loads through), of every loop's loads
    where = _locations(llir)
    for fn, f in funcs.items():
        for head, latch in f.loops:
            blocks = set(f.order[head : latch + 1])
            for block, text in f.instructions:
                width = _load_width(text) if block in blocks else None
                if width is not None:
                    dbg = re.search(r"!dbg (![0-9]+)", text)
                    at = where(dbg.group(1)) if dbg else "?"
                    loads += [
                        (fn, f.order[head], width, at, p) for p in re.findall(r"ptr addrspace\(1\) (%[\w.]+)", text)
                    ]
    for _ in range(_ROOT_PASSES):
        for fn, _head, _width, _at, p in loads:
            roots(fn, p)
        if memo == known:
            break
        known, memo = memo, {}
    loops: dict[str, LoopLoads] = {}
    for fn, head, width, at, p in loads:
        for r in sorted(roots(fn, p) & weights):
            loops.setdefault(f"{fn}:{head}", LoopLoads(f"{fn}:{head}")).widths.setdefault(r, []).append((width, at))
    return list(loops.values())


def _define_line(llir: str, name: str) -> str:
    m = re.search(rf'^define[^\n]*@"?{re.escape(name)}"?\(', llir, flags=re.M)
    return m.group(0) if m else ""


# ----------------------------------------------------------------------------- PTX: acquire after every spin


_PTX_LABEL = re.compile(r"^([A-Za-z_$%][\w$]*):")  # PTX identifiers: [a-zA-Z][a-zA-Z0-9_$]* or [_$%][a-zA-Z0-9_$]+


def _ptx_qualifiers(line: str) -> list[str]:
    """The opcode of a PTX line split at its dots (``ld.global.v4.b32`` -> ld, global, v4, b32), without a guard
    predicate, a label sharing its line (``$L__BB0_1: ld...``, which ptxas accepts) or the brace of an inline-asm
    block; [] for what is no instruction (a label alone, directive, comment)."""
    text = _PTX_LABEL.sub("", line.strip().lstrip("{").strip(), count=1).strip()
    text = re.sub(r"^@!?%\w+\s+", "", text)
    if not text or text.startswith((".", "//", "}")):
        return []
    return text.split()[0].rstrip(";").split(".")


def _may_be_global(q: list[str]) -> bool:
    """The access may be to global memory: ``.global``, or generic addressing (no state space)."""
    return not any(x.split("::")[0] in ("shared", "local", "param", "const") for x in q[1:])


def _polls(q: list[str]) -> bool:
    """An atomic, or a volatile / relaxed / acquire load (a read no compiler may hoist out of a loop)."""
    return _may_be_global(q) and (q[0] == "atom" or q[0] == "ld" and bool({"volatile", "relaxed", "acquire"} & set(q)))


def _reads_global(q: list[str]) -> bool:
    return (q[0] in ("ld", "ldu", "atom") and _may_be_global(q)) or (q[:2] == ["cp", "async"] and "global" in q)


def _orders_other_ctas(q: list[str]) -> bool:
    """An acquire (or fence) that orders what follows after a wait on another CTA's release. PTX ISA memory
    model: the two must be morally strong, so the scope must hold both threads (``.gpu`` / ``.sys``; ``atom``'s
    scope is ``.gpu`` when none is written); a fence must be ``fence.sc`` / ``fence.acq_rel`` (not
    ``fence.proxy.*``); ``membar.gl`` / ``membar.sys`` are ``fence.sc.gpu`` / ``fence.sc.sys``."""
    if q[0] == "membar":
        return q[1:] in (["gl"], ["sys"])
    if q[0] == "fence":
        return set(q[1:]) <= {"sc", "acq_rel", "gpu", "sys"} and bool({"gpu", "sys"} & set(q))
    return q[0] in ("ld", "atom") and bool({"acquire", "acq_rel"} & set(q)) and not {"cta", "cluster"} & set(q)


def _address(line: str) -> str:
    """The ``[address]`` operand of a PTX instruction, spaces and a ``+0`` / ``+0x0`` offset removed ("" when it
    has none)."""
    m = re.search(r"\[([^\]]*)\]", line)
    return re.sub(r"\+0(x0+)?$", "", re.sub(r"\s+", "", m.group(1))) if m else ""


def _written(line: str, q: list[str]) -> set[str]:
    """The registers a PTX instruction writes: its first operand (a register or a ``{...}`` vector of them), for
    every opcode that has a destination (not ``st`` / ``red`` / branches / fences / barriers)."""
    if not q or q[0] in ("st", "red", "bra", "ret", "exit", "fence", "membar", "bar", "barrier", "cp", "prefetch"):
        return set()
    ops = re.sub(r"^.*?\b" + re.escape(".".join(q)) + r"\S*", "", line, count=1)
    first = re.match(r"\s*(\{[^}]*\}|[^,;]+)", ops)
    return set(re.findall(r"%\w+", first.group(1))) if first else set()


def _unwritten(addresses: set[str], written: set[str]) -> set[str]:
    return {a for a in addresses if not set(re.findall(r"%\w+", a)) & written}


def spin_waits(ptx: str, max_body: int = 60) -> list[dict]:
    """Per PTX spin loop - a loop of at most ``max_body`` instructions (not counting labels, directives such as
    ``.loc``, comments) that polls memory that may be global (an atomic, or a volatile / relaxed / acquire load;
    generic addressing included) and stores none: {"label", "acquire": bool, "how"}. It is ordered when the poll
    is an acquire at ``.gpu`` / ``.sys`` scope itself, or such a fence (or an acquire re-read of a polled address)
    follows the loop before any other read of global memory (``ld``, ``atom``, ``cp.async``) and before the
    function ends (``ret`` / ``exit`` / the next function); see ``_orders_other_ctas``."""
    lines = [ln.strip() for ln in ptx.splitlines()]
    labels: dict[str, list[int]] = {}  # a label may repeat in the blocks of inline asm inlined twice
    for i, ln in enumerate(lines):
        m = _PTX_LABEL.match(ln)
        if m:
            labels.setdefault(m.group(1), []).append(i)
    out, seen = [], set()
    for i, ln in enumerate(lines):
        m = re.search(r"\bbra(?:\.uni)?\s+([\w$%]+)\s*;", ln)
        start = max((j for j in labels.get(m.group(1), []) if j <= i), default=None) if m else None
        if start is None or start in seen:
            continue
        body = [q for q in map(_ptx_qualifiers, lines[start : i + 1]) if q]
        if len(body) > max_body:
            continue
        polls = [q for q in body if _polls(q)]
        if not polls or any(q[0] in ("st", "red") and _may_be_global(q) for q in body):
            continue
        seen.add(start)
        # the addresses polled at the loop's exit: a register written after a poll names another location then
        polled: set[str] = set()
        for b in lines[start : i + 1]:
            q = _ptx_qualifiers(b)
            if q and _polls(q):
                polled.add(_address(b))
            polled = _unwritten(polled, _written(b, q))  # after the read: ``ld %rd2, [%rd2]`` moves on
        if any(_orders_other_ctas(q) for q in polls):
            out.append({"label": m.group(1), "acquire": True, "how": "the poll is an acquire"})
            continue
        after = "none"
        for b in lines[i + 1 :]:
            q = _ptx_qualifiers(b)
            ends = q[:1] in (["ret"], ["exit"]) and not b.startswith("@")
            if ends or re.search(r"(^|\s)\.(entry|func)\b", b):  # the function's end, or the next function
                break
            # a fence orders the poll before it; an acquire read only if it re-reads a polled address (it then
            # reads the release's value or a later one: PTX memory model, release sequence), not another address
            rereads = bool(q) and _may_be_global(q) and _address(b) in polled  # shared memory holds no release
            if q and _orders_other_ctas(q) and (q[0] in ("fence", "membar") or rereads):
                after = "acquire after the loop"
                break
            if q and _reads_global(q):
                break
            polled = _unwritten(polled, _written(b, q))
        out.append({"label": m.group(1), "acquire": after != "none", "how": after})
    return out


# ----------------------------------------------------------------------------- one kernel


@dataclass
class KernelReport:
    """What ``inspect`` read of one compiled kernel. ``weight_loads``: per streamed weight argument, the
    (width, source location) of its load instructions inside loops (16 bytes wanted); ``side_loads`` the same
    for side streams (MXFP4 scales: no more load instructions than the weights they scale - one per thread
    and step, not one per element)."""

    name: str
    num_warps: int
    registers: int | None
    spill_bytes: int
    shared_bytes: int
    ctas_per_sm: int
    grid: int | None
    weight_loads: dict[str, list[tuple[int, str]]]
    side_loads: dict[str, list[tuple[int, str]]]
    spins: list[dict]
    min_load_bytes: int = 16  # the width every weight load must reach (a narrower one is a violation)

    @property
    def violations(self) -> list[str]:
        out = []
        if self.spill_bytes:
            out.append(f"{self.name}: {self.spill_bytes} bytes of register spills")
        if self.registers is None:
            out.append(f"{self.name}: ptxas reported no register count")
        if self.ctas_per_sm < 1:
            out.append(
                f"{self.name}: cannot run ({self.registers} registers x {self.num_warps} warps, "
                f"{self.shared_bytes} B shared)"
            )
        for arg, loads in self.weight_loads.items():
            narrow = sorted({where for w, where in loads if w < self.min_load_bytes})
            if narrow:
                out.append(
                    f"{self.name}: weight {arg} streams with loads under {self.min_load_bytes} bytes at "
                    f"{', '.join(narrow[:4])}"
                )
        weight_count = sum(len(loads) for loads in self.weight_loads.values())
        for arg, loads in self.side_loads.items():
            if len(loads) > weight_count:
                where = sorted({w for _, w in loads})
                out.append(
                    f"{self.name}: {arg} issues {len(loads)} loads against {weight_count} of the weights at "
                    f"{', '.join(where[:4])} (a load per element?)"
                )
        for s in self.spins:
            if not s["acquire"]:
                out.append(f"{self.name}: the spin-wait at {s['label']} has no acquire after it")
        return out

    def load_widths(self) -> str:
        widths = {w for loads in (*self.weight_loads.values(), *self.side_loads.values()) for w, _ in loads}
        return ",".join(str(w) for w in sorted(widths)) or "-"


def inspect(
    kernel,
    arg_names: list[str],
    weights: set[str],
    name: str,
    grid: int | None = None,
    target: Target = H100,
    fp_fusion: bool = True,
    side: set[str] = frozenset(),
    min_load_bytes: int = 16,
) -> KernelReport:
    """The report of a compiled kernel (see the module docstring); ``weights`` / ``side``: the arguments that are
    streamed weights / side streams (``*name``: pointers loaded from the table argument ``name``);
    ``min_load_bytes``: the load width they must reach (16: ``ld.global.v4``)."""
    md = kernel.metadata
    num_warps = md.num_warps
    usage = ptxas_usage(kernel.asm["ptx"], target.arch or 90, fp_fusion)
    shared = int(md.shared)
    ctas = target.occupancy(usage["registers"] or 256, shared, num_warps)
    loads: dict[str, list] = {}
    side_loads: dict[str, list] = {}
    for loop in weight_loop_loads(kernel.asm["llir"], arg_names, set(weights) | set(side)):
        for arg, widths in loop.widths.items():
            (side_loads if arg in side else loads).setdefault(arg, []).extend(widths)
    spill = usage["spill_store_bytes"] + usage["spill_load_bytes"]
    return KernelReport(
        name,
        num_warps,
        usage["registers"],
        spill,
        shared,
        ctas,
        grid,
        loads,
        side_loads,
        spin_waits(kernel.asm["ptx"]),
        min_load_bytes,
    )
