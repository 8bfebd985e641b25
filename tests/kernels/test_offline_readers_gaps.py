"""Gaps a second mutation audit of the offline GPU check's readers found (``kernels/offline.py``,
``kernels/ptx_pass.py``), with no compile and no GPU: what ptxas's and nvdisasm's reports add up to (stand-in
outputs), which loops of a hand-written LLVM module load which weights, how ``inspect`` assembles a report,
spin-wait corner cases, and how the PTX pass chains itself into Triton's stage hook."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from nonstop.kernels import offline, ptx_pass
from nonstop.kernels.offline import (
    KernelReport,
    LoopLoads,
    spin_waits,
    weight_loop_loads,
)

PTXAS_TEXT = """ptxas info    : Compiling entry function 'megakernel' for 'sm_90a'
ptxas info    : Function properties for task_3
    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 230 registers, used 0 barriers
ptxas info    : Function properties for megakernel
    16 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 384 bytes cmem[0]
"""


@pytest.fixture
def fake_ptxas(tmp_path, monkeypatch):
    """ptxas_usage with a stand-in ptxas (it prints ``PTXAS_TEXT``) and its cache in ``tmp_path``."""
    compiler = pytest.importorskip("triton.backends.nvidia.compiler")
    monkeypatch.setattr(
        compiler,
        "get_ptxas",
        lambda arch=90: SimpleNamespace(path="/opt/stand-in/ptxas"),
    )
    monkeypatch.setattr(offline, "_cache_dir", lambda: str(tmp_path))
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        return SimpleNamespace(returncode=0, stdout="", stderr=PTXAS_TEXT)

    monkeypatch.setattr(offline.subprocess, "run", run)
    return calls


def test_ptxas_usage_is_the_most_registers_and_every_spill_of_the_module(fake_ptxas):
    """Registers: the hungriest function (230, not the kernel's 128 or the first number); spills: stores and
    loads summed over the functions separately (8 + 4, 12 + 4); stack: the largest frame (24)."""
    usage = offline.ptxas_usage("// ptx A", 90)
    assert usage == {
        "registers": 230,
        "spill_store_bytes": 12,
        "spill_load_bytes": 16,
        "stack_bytes": 24,
    }


def test_ptxas_usage_is_cached_per_option_set(fake_ptxas):
    """``fp_fusion=False`` runs ptxas with ``--fmad=false`` (and only then), under a cache key of its own: the
    fused result must not be handed back for it; the same PTX and options again come from the cache."""
    offline.ptxas_usage("// ptx B", 90, fp_fusion=True)
    offline.ptxas_usage("// ptx B", 90, fp_fusion=False)
    offline.ptxas_usage("// ptx B", 90, fp_fusion=True)
    assert len(fake_ptxas) == 2
    assert "--fmad=false" not in fake_ptxas[0] and "--fmad=false" in fake_ptxas[1]


def test_function_registers_are_the_highest_register_plus_one(monkeypatch):
    """Per function label of the SASS (section and local labels, which start with a dot, are no functions):
    its highest register R<n> + 1."""
    compiler = pytest.importorskip("triton.backends.nvidia.compiler")
    monkeypatch.setattr(
        compiler,
        "get_ptxas",
        lambda arch=90: SimpleNamespace(path="/opt/stand-in/ptxas"),
    )
    sass = (
        "\t.text.megakernel:\n"
        "megakernel:\n"
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;\n"
        "        /*0010*/                   IADD3 R20, R3, R7, RZ ;\n"
        ".L_x_0:\n"
        "        /*0020*/                   IADD3 R21, R3, R7, RZ ;\n"
        "task_3:\n"
        "        /*0000*/                   FFMA R254, R2, R3, R4 ;\n"
    )
    monkeypatch.setattr(
        offline.subprocess,
        "run",
        lambda cmd, **kw: SimpleNamespace(stdout=sass, returncode=0),
    )
    assert offline.function_registers(b"\x7fELF", 90) == {
        "megakernel": 22,
        "task_3": 255,
    }


# A kernel (w, x, table, and a trailing i32 that has no runtime parameter name) with a one-block loop that
# loads w 16 bytes wide, a byte through a pointer loaded from ``table``, x (no weight), and a pointer made from
# the trailing integer; it calls a non-inlined helper with w, which loads it 4 bytes wide in a loop of its own.
LLIR = """define ptx_kernel void @k(ptr addrspace(1) %0, ptr addrspace(1) %1, ptr addrspace(1) %2, i32 %3) !dbg !5 {
  %5 = load ptr addrspace(1), ptr addrspace(1) %2, align 8
  %6 = LD_B32(%1)
  %13 = inttoptr i32 %3 to ptr addrspace(1)
  br label %7

7:
  %8 = phi i32 [ 0, %4 ], [ %14, %7 ]
  %9 = getelementptr bfloat, ptr addrspace(1) %0, i32 %8
  %10 = LD_V4(%9), !dbg !10
  %11 = getelementptr i8, ptr addrspace(1) %5, i32 %8
  %12 = LD_B8(%11)
  %17 = getelementptr float, ptr addrspace(1) %1, i32 %8
  %18 = LD_B32(%17)
  %19 = LD_B32(%13)
  call void @helper(ptr addrspace(1) %0, i32 %8)
  %14 = add i32 %8, 1
  %15 = icmp slt i32 %14, %3
  br i1 %15, label %7, label %16

16:
  ret void
}

define internal void @helper(ptr addrspace(1) %0, i32 %1) {
  br label %3

3:
  %4 = phi i32 [ 0, %2 ], [ %7, %3 ]
  %5 = getelementptr float, ptr addrspace(1) %0, i32 %4
  %6 = LD_B32(%5)
  %7 = add i32 %4, 1
  %8 = icmp slt i32 %7, %1
  br i1 %8, label %3, label %9

9:
  ret void
}

!1 = !DIFile(filename: "k.py", directory: "/src")
!5 = distinct !DISubprogram(name: "k", scope: !1, file: !1, line: 1)
!6 = distinct !DILexicalBlock(scope: !5, line: 2)
!7 = distinct !DILexicalBlock(scope: !6, line: 3)
!10 = !DILocation(line: 12, column: 5, scope: !7)
"""
# global loads are inline PTX, as Triton emits them
_ASM = 'tail call {ty} asm sideeffect "ld.global.{op} {{ {out} }}, [ ${n} + 0 ];", "{cons}"(ptr addrspace(1) \\1)'
for _name, _asm in {
    "LD_V4": _ASM.format(ty="{ i32, i32, i32, i32 }", op="v4.b32", out="$0, $1, $2, $3", n=4, cons="=r,=r,=r,=r,l"),
    "LD_B32": _ASM.format(ty="i32", op="b32", out="$0", n=1, cons="=r,l"),
    "LD_B8": _ASM.format(ty="i8", op="b8", out="$0", n=1, cons="=c,l"),
}.items():
    LLIR = re.sub(rf"{_name}\((%\d+)\)", _asm, LLIR)
ARG_NAMES = ["w", "x", "table"]


def test_weight_loops_of_a_module_by_hand():
    """Both loops are found (each a single block that branches to itself), with exactly the weight loads in
    them: w at 16 bytes (located through nested lexical blocks to k.py:12), the byte read through the pointer
    loaded from ``table`` (``*table``), and w again inside the helper it is passed to; x (no weight) and the
    pointer from an argument with no name are not counted (and do not raise)."""
    got = weight_loop_loads(LLIR, ARG_NAMES, {"w", "*table"})
    assert got == [
        LoopLoads("k:7", {"w": [(16, "k.py:12")], "*table": [(1, "?")]}),
        LoopLoads("helper:3", {"w": [(4, "?")]}),
    ]


def test_loads_outside_every_loop_are_not_counted():
    """x is loaded once before the loop and once inside it: only the one inside counts."""
    got = weight_loop_loads(LLIR, ARG_NAMES, {"x"})
    assert got == [LoopLoads("k:7", {"x": [(4, "?")]})]


def test_a_plain_llvm_weight_load_in_a_loop_is_counted():
    """A weight load written as an LLVM ``load`` (not inline PTX) inside a loop counts at its type's width:
    two bytes for an i16, four lanes of bf16 for a <4 x bfloat>. ``weight_loop_loads`` reads the instruction
    without its ``%v =``, which once made every such load invisible to the check."""
    llir = """define ptx_kernel void @k(ptr addrspace(1) %0, i32 %1) {
  br label %3

3:
  %4 = phi i32 [ 0, %2 ], [ %7, %3 ]
  %5 = getelementptr i16, ptr addrspace(1) %0, i32 %4
  %6 = load i16, ptr addrspace(1) %5, align 2
  %10 = load <4 x bfloat>, ptr addrspace(1) %5, align 8
  %7 = add i32 %4, 1
  %8 = icmp slt i32 %7, %1
  br i1 %8, label %3, label %9

9:
  ret void
}
"""
    assert weight_loop_loads(llir, ["w"], {"w"}) == [LoopLoads("k:3", {"w": [(2, "?"), (8, "?")]})]


def test_inspect_assembles_the_report(monkeypatch):
    """A kernel ptxas gives no register count is taken at 256 registers (it cannot run: 0 CTAs); spills are
    stores + loads; arguments named in ``side`` go to the side loads, the others to the weight loads."""
    monkeypatch.setattr(
        offline,
        "ptxas_usage",
        lambda ptx, arch=90, fp_fusion=True: {
            "registers": None,
            "spill_store_bytes": 8,
            "spill_load_bytes": 4,
            "stack_bytes": 0,
        },
    )
    kernel = SimpleNamespace(
        metadata=SimpleNamespace(num_warps=8, shared=1024),
        asm={"ptx": "", "llir": LLIR},
    )
    report = offline.inspect(kernel, ARG_NAMES, {"w"}, "k", grid=4, side={"*table"})
    assert report.ctas_per_sm == 0 and report.spill_bytes == 12 and report.shared_bytes == 1024
    assert report.weight_loads == {"w": [(16, "k.py:12"), (4, "?")]}
    assert report.side_loads == {"*table": [(1, "?")]}
    assert "k: cannot run (None registers x 8 warps, 1024 B shared)" in report.violations


def test_a_kernel_with_no_cta_per_sm_is_a_violation():
    report = KernelReport("k", 8, 200, 0, 300000, 0, 1, {}, {}, [])
    assert report.violations == ["k: cannot run (200 registers x 8 warps, 300000 B shared)"]


SPIN = """
$L__BB0_1:
{poll}
	setp.lt.s32 	%p1, %r5, %r1;
	@%p1 bra 	$L__BB0_1;
{after}
"""


def test_an_acq_rel_poll_is_an_acquire():
    got = spin_waits(SPIN.format(poll="	atom.global.acq_rel.gpu.add.u32 	%r5, [%rd2], 0;", after=""))
    assert [(s["acquire"], s["how"]) for s in got] == [(True, "the poll is an acquire")]


def test_a_fence_after_the_next_global_load_is_too_late():
    """The acquire must come before the first global load after the loop: that load may see stale data."""
    after = "	ld.global.b32 	%r7, [%rd3];\n	fence.acq_rel.gpu;"
    got = spin_waits(SPIN.format(poll="	ld.volatile.global.b32 	%r5, [%rd2];", after=after))
    assert [(s["acquire"], s["how"]) for s in got] == [(False, "none")]


def test_two_branches_back_to_one_poll_are_one_spin_wait():
    poll = "	ld.volatile.global.b32 	%r5, [%rd2];"
    ptx = SPIN.format(poll=poll, after="	@%p2 bra 	$L__BB0_1;\n	fence.sc.gpu;")
    assert [s["label"] for s in spin_waits(ptx)] == ["$L__BB0_1"]


def test_a_long_loop_is_no_spin_wait():
    """A loop of more than ``max_body`` instructions that reads a volatile flag does work: not a spin."""
    filler = "\n".join("	add.s32 	%r9, %r9, 1;" for _ in range(70))
    ptx = SPIN.format(poll="	ld.volatile.global.b32 	%r5, [%rd2];\n" + filler, after="")
    assert spin_waits(ptx) == []
    assert len(spin_waits(ptx, max_body=100)) == 1


@pytest.fixture
def hook_knob(monkeypatch):
    """Triton's stage-hook knob, emptied, and the pass not installed."""
    knobs = pytest.importorskip("triton.knobs")
    if not hasattr(knobs.runtime, "add_stages_inspection_hook"):
        pytest.skip("this Triton has no stage hook")
    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", None)
    monkeypatch.setattr(ptx_pass, "_installed", None)
    return knobs.runtime


def test_install_is_idempotent(hook_knob):
    """Installing twice must not chain the pass to itself (its cache key would change and it would run twice)."""
    assert ptx_pass.install()
    hook = hook_knob.add_stages_inspection_hook
    assert hook() == (ptx_pass.PASS_KEY, ptx_pass.PASS_KEY)
    assert ptx_pass.install()
    assert hook_knob.add_stages_inspection_hook is hook


def test_install_chains_a_hook_already_set(hook_knob):
    """A hook set before keeps running and its cache key and hash are extended, not replaced; the ``ptx``
    stage is wrapped (and a pipeline without one is left alone)."""
    seen = []

    def previous(*args):
        if not args:
            return "theirs", "abc"
        seen.append(args)

    hook_knob.add_stages_inspection_hook = previous
    assert ptx_pass.install()
    hook = hook_knob.add_stages_inspection_hook
    assert hook() == ("theirs" + ptx_pass.PASS_KEY, "abc" + ptx_pass.PASS_KEY)
    load = "\t// begin inline asm\n\t@%p3 ld.shared.b32 %r4, [ %r9 + 0 ];\n\t// end inline asm"
    stages = {"ttir": None, "ptx": lambda src, metadata: load}
    hook("backend", stages, "options", "language", 90)
    assert len(seen) == 1 and seen[0][1] is stages
    assert "mov.b32 \t%r4, 0;" in stages["ptx"](None, {"name": ptx_pass.KERNEL_NAME})
    no_ptx = {"ttir": None}
    hook("backend", no_ptx, "options", "language", 90)
    assert no_ptx == {"ttir": None}
