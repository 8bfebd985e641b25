"""Gaps a mutation audit of the offline GPU check's readers found (``kernels/offline.py``, ``kernels/ptx_pass.py``):
pure text in, facts out, no compile - the load width of each kind of load instruction, what counts as a spin
loop and as an acquire after one, a report without a register count, and the PTX pass's register widths, its
kernel filter and a truncated PTX."""

from __future__ import annotations

from nonstop.kernels import ptx_pass
from nonstop.kernels.offline import KernelReport, _load_width, spin_waits


def test_load_widths_of_ptx_and_llvm_loads():
    """Bytes one load instruction moves: lanes x element bits / 8."""
    cases = {
        "@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];": 16,
        "ld.global.v2.b32 { %r1, %r2 }, [ %rd1 + 0 ];": 8,
        "ld.global.b32 { %r1 }, [ %rd1 + 0 ];": 4,
        "ld.global.b16 { %rs1 }, [ %rd1 + 0 ];": 2,
        "ld.global.cg.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];": 16,
        "ld.global.v2.b64 { %rd2, %rd3 }, [ %rd1 + 0 ];": 16,
        "cp.async.cg.shared.global [ %r1 + 0 ], [ %rd1 + 0 ], 0x10, %r2;": 16,
        "cp.async.ca.shared.global [ %r1 + 0 ], [ %rd1 + 0 ], 0x4, %r2;": 4,
        "%5 = load <4 x i32>, ptr addrspace(1) %4, align 16": 16,
        "%5 = load <8 x bfloat>, ptr addrspace(1) %4, align 16": 16,
        "%5 = load bfloat, ptr addrspace(1) %4, align 2": 2,
        "%5 = load volatile i32, ptr addrspace(1) %4, align 4": 4,
    }
    for text, width in cases.items():
        assert _load_width(text) == width, text
    assert _load_width("ld.shared.b32 %r1, [ %r2 + 0 ];") is None
    assert _load_width("%5 = load i32, ptr addrspace(3) %4, align 4") is None


LOOP = """
$L__BB0_1:
	ld.volatile.global.b32 	%r5, [%rd2];
{store}
	setp.lt.s32 	%p1, %r5, %r1;
	@%p1 bra 	$L__BB0_1;
{after}
	ld.global.b32 	%r7, [%rd3];
"""


def test_a_loop_that_stores_to_global_memory_is_no_spin_wait():
    """A loop that polls and also stores (or reduces) into global memory does work: not a spin-wait."""
    assert [s["acquire"] for s in spin_waits(LOOP.format(store="", after=""))] == [False]
    assert spin_waits(LOOP.format(store="	st.global.b32 	[%rd4], %r5;", after="")) == []
    assert spin_waits(LOOP.format(store="	@%p2 red.global.add.s32 	[%rd4], 1;", after="")) == []


def test_any_fence_after_the_spin_orders_what_follows():
    got = spin_waits(LOOP.format(store="", after="	fence.sc.gpu;"))
    assert [(s["acquire"], s["how"]) for s in got] == [(True, "acquire after the loop")]


def test_a_report_without_a_register_count_is_a_violation():
    report = KernelReport("k", 4, None, 0, 0, 1, 1, {}, {}, [])
    assert report.violations == ["k: ptxas reported no register count"]


BYTE_LOAD = """
	// begin inline asm
	@%p3 ld.shared.b8 %rs4, [ %r9 + 0 ];
	// end inline asm
"""


def test_the_pass_defines_byte_loads_in_16_bit_registers():
    """PTX has no mov.b8: an 8-bit load's register (%rs) is defined with mov.b16."""
    out, changed = ptx_pass.define_predicated_loads(BYTE_LOAD)
    assert changed == 1
    assert "mov.b16 \t%rs4, 0;" in out and "mov.b8" not in out


def test_the_pass_leaves_a_truncated_block_and_other_kernels_alone():
    truncated = "\t// begin inline asm\n\t@%p3 ld.shared.b32 %r4, [ %r9 + 0 ];"
    assert ptx_pass.define_predicated_loads(truncated) == (truncated, 0)
    stage = ptx_pass._wrap_ptx_stage(lambda src, metadata: BYTE_LOAD)
    assert stage(None, {"name": "gemv_kernel"}) == BYTE_LOAD
    assert "mov.b16" in stage(None, {"name": ptx_pass.KERNEL_NAME})
