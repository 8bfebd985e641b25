"""A PTX pass for the megakernel: define the destination of every predicated shared-memory load first.

Why: a reduction across warps ends with each thread reading one warp partial from shared memory; Triton 3.6
emits that read as an inline-asm ``@%p ld.shared.b32 %r, [addr];`` whose register is left undefined on the
threads the predicate turns off (Triton 3.9 reads with every thread). In a kernel this costs nothing, but
in a non-inlined function (each megakernel task class is one, ``runtime/megakernel/codegen/source.py``)
ptxas treats the undefined value as live from the function's entry: it homes it in local memory (a 4-byte
spill store and load per such reduction) and keeps it live through the whole body, which pushes the
register-hungry classes (KDA core, sampling) past 255 registers. Measured on the Kimi K3 megakernel (4
layers, 1 row) under Triton 3.6: 255 registers and 216 bytes of spills as emitted; 230 registers and no
spill with this pass.

The pass (``define_predicated_loads``): ``mov.b<W> %r, 0;`` before each inline-asm block that is exactly
one predicated shared load. It changes no result: the compiler treats the asm output as a new value (the
register's old content is dead there), and the threads whose predicate is off never use what they read.
``install`` adds it to Triton's compile pipeline (the ``add_stages_inspection_hook`` knob, chained with a
hook already set; ``launch.py`` installs it on import, before any kernel compiles). It rewrites the PTX of
the kernel named ``KERNEL_NAME`` only, under every Triton version (one that emits no such load gives it
nothing to do); the PTX it returns is the one ptxas assembles and the offline check (``nonstop gpucheck``)
reads.
"""

from __future__ import annotations

import re

KERNEL_NAME = "megakernel"
PASS_KEY = "nonstop-ptx-defined-shared-loads-v1"  # added to Triton's cache key where the Triton version asks

_LOAD = re.compile(r"\s*@!?%p\d+\s+ld\.shared(?:\.v\d)?\.b(\d+)\s+(\{[^}]*\}|%\w+)\s*,\s*\[[^\]]*\];\s*$")


def define_predicated_loads(ptx: str) -> tuple[str, int]:
    """(``ptx`` with a ``mov`` of 0 into each destination register of an inline-asm block holding exactly one
    predicated ``ld.shared``, the number of blocks changed). Idempotent: a block whose registers are defined
    right before it (by this pass) is left alone."""
    lines = ptx.split("\n")
    out: list[str] = []
    count = 0
    for i, line in enumerate(lines):
        load = _LOAD.match(lines[i + 1]) if line.strip() == "// begin inline asm" and i + 2 < len(lines) else None
        if load and lines[i + 2].strip() == "// end inline asm":
            indent = line[: len(line) - len(line.lstrip())]
            bits = max(16, int(load.group(1)))  # 8-bit values live in 16-bit registers
            movs = [f"{indent}mov.b{bits} \t{r}, 0;" for r in re.findall(r"%\w+", load.group(2))]
            if out[-len(movs) :] != movs:
                out += movs
                count += 1
        out.append(line)
    return "\n".join(out), count


def _wrap_ptx_stage(stage):
    def ptx_stage(src, metadata):
        ptx = stage(src, metadata)
        if metadata.get("name") == KERNEL_NAME:
            ptx, _ = define_predicated_loads(ptx)
        return ptx

    return ptx_stage


_installed = None


def install() -> bool:
    """Add the pass to Triton's pipeline (idempotent); False where this Triton has no stage hook."""
    global _installed
    try:
        from triton import knobs
    except ImportError:
        return False
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "add_stages_inspection_hook"):
        return False
    previous = runtime.add_stages_inspection_hook
    if previous is not None and previous is _installed:
        return True
    own_key = (PASS_KEY, PASS_KEY)

    def hook(*args):
        if not args:  # newer Tritons ask for the hook's cache key and hash (also on every launch: kept cheap)
            if previous is None:
                return own_key
            key, digest = previous()
            return key + PASS_KEY, f"{digest}{PASS_KEY}"
        if previous is not None:
            previous(*args)
        stages = args[1]
        if "ptx" in stages:
            stages["ptx"] = _wrap_ptx_stage(stages["ptx"])

    runtime.add_stages_inspection_hook = hook
    _installed = hook
    return True
