"""Probes of the text readers behind ``nonstop gpucheck`` (``kernels/offline.py``): ``spin_waits`` over PTX,
``_load_width`` / ``weight_loop_loads`` over LLVM IR, ``KernelReport.violations`` and ``Target.occupancy``.
Pure text and arithmetic: no compile, no GPU. Expected values come from the PTX ISA (instruction syntax and
memory-model semantics) and NVIDIA's published occupancy rules (cuda_occupancy.h), not from the code under test."""

from __future__ import annotations

import pytest

from nonstop.kernels.offline import KernelReport, _load_width, spin_waits, weight_loop_loads
from nonstop.kernels.platform import H100

SPIN = """
$L__BB0_1:
	ld.volatile.global.b32 	%r5, [%rd2];
	setp.lt.s32 	%p1, %r5, %r1;
	@%p1 bra 	$L__BB0_1;
AFTER
	ld.global.b32 	%r7, [%rd3];
"""


def _spin(after: str = "", poll: str | None = None, body: str = "") -> list[bool]:
    text = SPIN.replace("AFTER", after)
    if poll:
        text = text.replace("ld.volatile.global.b32", poll)
    if body:
        text = text.replace("\tsetp.lt", body + "\tsetp.lt")
    return [s["acquire"] for s in spin_waits(text)]


# ----------------------------------------------------------------------------- spin-waits that must be flagged


def test_a_volatile_poll_with_no_acquire_is_flagged():
    assert _spin() == [False]
    assert _spin(poll="ld.relaxed.gpu.global.b32") == [False]
    assert _spin(poll="@%p2 atom.global.gpu.relaxed.add.u32") == [False]


def test_an_acquire_after_a_later_global_load_does_not_count():
    """A load between the loop and the fence is not ordered by it."""
    assert _spin("\tld.global.b32 \t%r9, [%rd4];\n\tfence.acq_rel.gpu;") == [False]


@pytest.mark.parametrize(
    "poll",
    [
        "ld.relaxed.gpu.b32",  # generic addressing (no .global): PTX allows it, the poll is still on global memory
        "ld.volatile.b32",
        "ld.global.gpu.relaxed.b32",  # qualifier order ptxas accepts (the repo's own test writes .gpu.acquire)
    ],
)
def test_a_poll_without_acquire_in_another_valid_spelling_is_flagged(poll):
    # fails on base: the loop is not recognised as a spin-wait at all (no row, so no violation)
    assert _spin(poll=poll) == [False]


def test_a_long_spin_loop_with_line_info_is_still_checked():
    """``max_body`` is documented as instructions; Triton's PTX interleaves ``.loc`` lines (-lineinfo) and
    ``// begin inline asm`` comments, which are not instructions."""
    body = "".join(f"\t.loc\t1 {i} 5\n\tadd.s32 \t%r{20 + i}, %r{20 + i}, 1;\n" for i in range(30))
    # fails on base: 30 instructions + 30 .loc lines exceed 60 lines and the unordered spin is skipped
    assert _spin(body=body) == [False]


def test_a_fence_of_another_function_does_not_order_this_spin():
    after = "\tret;\n}\n\n.visible .func other()\n{\n\tfence.acq_rel.gpu;"
    # fails on base: the scan after the loop runs past ``ret`` / ``}`` into the next function's fence
    assert _spin(after) == [False]


def test_a_proxy_fence_is_not_an_acquire():
    """``fence.proxy.*`` orders proxies (generic vs async), it is no acquire (PTX ISA, membar/fence)."""
    # fails on base: any line starting ``fence.`` counts as the acquire
    assert _spin("\tfence.proxy.async.global;") == [False]


def test_a_cta_scoped_acquire_does_not_order_a_wait_on_other_ctas():
    """The waits synchronise CTAs on different SMs (the megakernel's tickets): a ``.cta``-scoped acquire or fence
    does not order them (PTX memory model: morally strong needs a scope that includes both threads)."""
    # fails on base: ``.acquire`` / ``fence.`` are accepted at any scope
    assert _spin(poll="ld.acquire.cta.global.b32") == [False]
    assert _spin("\tfence.acq_rel.cta;") == [False]


def test_a_hand_written_spin_in_an_asm_block_is_checked():
    """Inline asm written as a block: a label without ``$`` and the poll on the block's first line (``{ ld...``);
    a fence after the block's closing brace still follows the loop in the same function."""
    text = "{ ld.volatile.global.b32 \t%r5, [%rd2]; }\nspin:\n{ ld.volatile.global.b32 \t%r5, [%rd2];\n"
    text += "\tsetp.lt.s32 \t%p1, %r5, %r1;\n\t@%p1 bra \tspin;\n}\n"
    # fails on base: the label ``spin`` is not a label to the reader and the braced poll is no poll
    assert [s["acquire"] for s in spin_waits(text)] == [False]
    assert [s["acquire"] for s in spin_waits(text + "\tfence.acq_rel.gpu;\n")] == [True]
    assert [s["acquire"] for s in spin_waits(text + "\t@%p2 ret;\n\tfence.acq_rel.gpu;\n")] == [True]


@pytest.mark.parametrize(
    "read",
    [
        "cp.async.cg.shared.global [%r9], [%rd4], 16;",
        "atom.global.gpu.relaxed.add.u32 \t%r9, [%rd4], 1;",
        "ld.b32 \t%r9, [%rd4];",  # generic addressing: may read global memory
    ],
)
def test_a_read_between_the_loop_and_the_fence_is_not_ordered(read):
    """The fence orders only the reads after it: a global read before it is unordered (PTX memory model)."""
    # fails on base: only ``ld.global`` ends the scan, so the fence after these reads is taken for the acquire
    assert _spin(f"\t{read}\n\tfence.acq_rel.gpu;") == [False]


@pytest.mark.parametrize(
    "after,ordered",
    [
        ("\tmembar.cta;", False),  # = fence.sc.cta
        ("\tmembar.sys;", True),  # = fence.sc.sys (fails on base: only ``fence.`` lines are fences)
        ("\tfence.sc.sys;", True),
        ("\tfence.acq_rel.cluster;", False),  # the CTAs a wait synchronises need not share a cluster (fails on base)
        ("\tld.shared.b32 \t%r9, [%r4];\n\tfence.acq_rel.gpu;", True),  # a shared-memory read is no global read
    ],
)
def test_fence_scopes_and_membar(after, ordered):
    assert _spin(after) == [ordered]


def test_an_atom_acquire_without_scope_is_gpu_scoped():
    """PTX ISA (atom): with no scope qualifier the operation has ``.gpu`` scope."""
    assert _spin(poll="atom.global.acquire.add.u32") == [True]


# ----------------------------------------------------------------------------- valid acquires that must pass


@pytest.mark.parametrize(
    "after",
    ["\tfence.acq_rel.gpu;", "\tfence.sc.gpu;", "\tld.acquire.gpu.global.b32 \t%r8, [%rd2];"],
)
def test_an_acquire_after_the_loop_passes(after):
    assert _spin(after) == [True]


@pytest.mark.parametrize(
    "poll", ["ld.acquire.gpu.global.b32", "ld.global.acquire.gpu.b32", "atom.global.gpu.acquire.add.u32"]
)
def test_an_acquiring_poll_passes(poll):
    assert _spin(poll=poll) == [True]


def test_membar_gl_after_the_loop_is_an_acquire():
    """``membar.gl`` has the semantics of ``fence.sc.gpu`` (PTX ISA: membar.{cta,gl,sys} = fence.sc.{cta,gpu,sys}),
    which with the relaxed poll before it forms an acquire pattern."""
    # fails on base: only lines starting ``fence.`` are taken for a fence
    assert _spin("\tmembar.gl;") == [True]


def test_a_store_or_forward_branch_is_no_spin():
    assert _spin(body="\tst.global.b32 \t[%rd9], %r5;\n") == []
    text = SPIN.replace("AFTER", "").replace("@%p1 bra \t$L__BB0_1;", "@%p1 bra \t$L__BB0_9;\n$L__BB0_9:")
    assert spin_waits(text) == []


# ----------------------------------------------------------------------------- load widths


@pytest.mark.parametrize(
    "text,width",
    [
        ("ld.global.v4.b32 { $0, $1, $2, $3 }, [ $4 + 0 ];", 16),
        ("ld.global.nc.v2.b32 { $0, $1 }, [ $2 + 0 ];", 8),
        ("ld.global.b16 $0, [ $1 + 0 ];", 2),
        ("ld.global.u8 $0, [ $1 + 0 ];", 1),
        ("ld.global.cg.b32 $0, [ $1 + 0 ];", 4),
        ("load <8 x bfloat>, ptr addrspace(1) %p, align 16", 16),
        ("load i32, ptr addrspace(1) %p, align 4", 4),
        ("cp.async.ca.shared.global [ $0 + 0 ], [ $1 + 0 ], 0x4, $2;", 4),
        ("cp.async.cg.shared.global [ $0 + 0 ], [ $1 + 0 ], 0x10, $2;", 16),
        ("load float, ptr addrspace(3) %p", None),  # shared memory is not streamed from HBM
        ("ld.shared.v4.b32 { $0, $1, $2, $3 }, [ $4 + 0 ];", None),
    ],
)
def test_load_widths(text, width):
    assert _load_width(text) == width


@pytest.mark.parametrize(
    "text,width",
    [
        # what Triton 3.9 emits for tl.load(..., eviction_policy="evict_first") of bf16 x 8 / fp32 x 1 a thread
        ("ld.global.L1::evict_first.L2::cache_hint.v4.b32 { $0, $1, $2, $3 }, [ $4 + 0 ], $5;", 16),
        ("ld.global.L1::evict_last.b32 { $0 }, [ $1 + 0 ];", 4),
        ("ld.global.nc.L1::no_allocate.v4.b32 { $0, $1, $2, $3 }, [ $4 + 0 ];", 16),
        ("ld.global.L2::128B.v2.b32 { $0, $1 }, [ $2 + 0 ];", 8),
        ("cp.async.cg.shared.global [ $0 + 0 ], [ $1 + 0 ], 16, $2;", 16),  # size in decimal: 16 bytes, not 0x16
    ],
)
def test_load_widths_with_cache_qualifiers(text, width):
    # fails on base: a load with an ``.L1::`` / ``.L2::`` qualifier is not a load at all (None): a weight
    # streamed with eviction hints is invisible to the width check; decimal ``16`` is read as hex (22)
    assert _load_width(text) == width


LOOP_IR = """define ptx_kernel void @k(ptr addrspace(1) %0, ptr addrspace(1) %1, i32 %2) !dbg !3 {
entry:
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %next, %loop ]
  %off = sext i32 %i to i64
  %gep = getelementptr float, ptr addrspace(1) %0, i64 %off
  LOAD
  %next = add i32 %i, 128
  %done = icmp sge i32 %next, %2
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""


def test_a_narrow_weight_load_in_a_loop_is_found():
    ir = LOOP_IR.replace("LOAD", "%w = load float, ptr addrspace(1) %gep, align 4")
    [loop] = weight_loop_loads(ir, ["w_ptr", "x_ptr", "n"], {"w_ptr"})
    assert [w for w, _ in loop.widths["w_ptr"]] == [4] and list(loop.widths) == ["w_ptr"]
    assert weight_loop_loads(ir, ["w_ptr", "x_ptr", "n"], {"x_ptr"}) == []  # the other argument streams nothing


def test_a_weight_streamed_with_cp_async_is_measured():
    """Triton's software pipeliner (``tl.range(num_stages > 1)``, which gemv / mlp / moe use) turns a loop's loads
    into ``cp.async`` copies to shared memory: an inline asm call that returns void (no ``%v =``). The docstring
    says "cp.async counts as its size"; a 4-byte cp.async weight stream must be reported."""
    load = (
        'tail call void asm sideeffect "cp.async.ca.shared.global [ $0 + 0 ], [ $1 + 0 ], 0x4, $2;", '
        '"r,l,r"(ptr addrspace(3) %s, ptr addrspace(1) %gep, i32 4)'
    )
    ir = LOOP_IR.replace("LOAD", load).replace("%off = sext", "%s = inttoptr i32 0 to ptr addrspace(3)\n  %off = sext")
    # fails on base: no loop is reported (the void call defines no value, so it is never looked at)
    [loop] = weight_loop_loads(ir, ["w_ptr", "x_ptr", "n"], {"w_ptr"})
    assert [w for w, _ in loop.widths["w_ptr"]] == [4]


# ----------------------------------------------------------------------------- the violations


def _report(**kw):
    base = dict(
        name="k", num_warps=4, registers=64, spill_bytes=0, shared_bytes=0, ctas_per_sm=8, grid=None,
        weight_loads={}, side_loads={}, spins=[],
    )  # fmt: skip
    return KernelReport(**{**base, **kw})


def test_each_violation_fires_alone():
    assert _report().violations == []
    assert _report(spill_bytes=4).violations == ["k: 4 bytes of register spills"]
    assert _report(registers=None).violations == ["k: ptxas reported no register count"]
    assert "cannot run" in _report(ctas_per_sm=0).violations[0]
    assert "under 16 bytes" in _report(weight_loads={"w": [(16, "a"), (8, "b:2")]}).violations[0]
    assert _report(weight_loads={"w": [(16, "a")]}, min_load_bytes=32).violations  # the floor is the argument
    assert _report(weight_loads={"w": [(4, "a")]}, min_load_bytes=4).violations == []
    spin = {"label": "$L", "acquire": False, "how": "none"}
    assert _report(spins=[spin]).violations == ["k: the spin-wait at $L has no acquire after it"]
    assert _report(spins=[{**spin, "acquire": True}]).violations == []
    # a side stream: as many loads as the weights pass, one more is reported
    w = {"w": [(16, "a"), (16, "b")]}
    assert _report(weight_loads=w, side_loads={"s": [(1, "c")] * 2}).violations == []
    assert "3 loads against 2" in _report(weight_loads=w, side_loads={"s": [(1, "c")] * 3}).violations[0]


# ----------------------------------------------------------------------------- occupancy against NVIDIA's rules


def _nvidia(regs: int, smem: int, warps: int) -> int:
    """CTAs per SM on sm_90 by NVIDIA's occupancy calculator (cuda_occupancy.h): registers are allocated per
    warp in units of 256 within each of the 4 SM sub-partitions (16384 registers each); 64 warps, 32 CTAs,
    228 KiB of shared memory per SM, 227 KiB per CTA, 1 KiB reserved per CTA, shared memory in units of 128 B."""
    if regs > 255 or smem > 227 * 1024:
        return 0
    per_warp = -(-regs * 32 // 256) * 256
    if per_warp * warps > 65536:
        return 0
    by_regs = (16384 // per_warp) * 4 // warps
    by_smem = 228 * 1024 // (-(-(smem + 1024) // 128) * 128)
    return min(by_regs, by_smem, 64 // warps, 32)


@pytest.mark.parametrize(
    "regs,smem,warps,ctas",
    [
        (255, 0, 8, 1),  # 255 -> 256 a thread, 8 warps = 65536: one CTA
        (255, 0, 16, 0),  # twice the register file
        (128, 0, 8, 2),
        (168, 0, 4, 3),
        (32, 0, 1, 32),  # the CTA limit
        (32, 0, 4, 16),  # 64 warps
        (64, 227 * 1024, 4, 1),  # the largest block
        (64, 227 * 1024 + 1, 4, 0),
        (64, 113 * 1024, 4, 2),  # 2 x (113 + 1) KiB = 228 KiB
        (64, 113 * 1024 + 1, 4, 1),
        (256, 0, 1, 0),
    ],
)
def test_occupancy_by_hand(regs, smem, warps, ctas):
    assert _nvidia(regs, smem, warps) == ctas
    assert H100.occupancy(regs, smem, warps) == ctas


@pytest.mark.parametrize("regs,smem,warps", [(73, 0, 1), (40, 0, 2), (200, 0, 2), (32, 6416, 1)])
def test_occupancy_of_small_ctas_follows_the_sub_partitions(regs, smem, warps):
    """73 registers x 1 warp: 2560 registers a warp, 6 warps per 16384-register sub-partition, 24 a SM; the SM-wide
    division gives 25. 6416 B of shared memory: 7440 B a CTA rounded up to 128 B is 7552 -> 30 CTAs, not 31."""
    # fails on base: the register file is divided as one pool and shared memory is not rounded to 128 B
    assert H100.occupancy(regs, smem, warps) == _nvidia(regs, smem, warps)
