"""Third mutation audit of the offline GPU check's readers (``nonstop/kernels/offline.py``): load widths of PTX
spellings the PTX ISA allows and the earlier audits did not pin. Expected widths come from the PTX ISA
(``cp.async`` cp-size operand; ``ld`` vector count x type bits / 8; state space after ``.volatile`` /
``.relaxed.scope``), not from the code under test."""

from __future__ import annotations

import pytest

from nonstop.kernels.offline import _load_width, weight_loop_loads
from tests.kernels.test_gpucheck_parsers_gaps import LOOP_IR


def test_a_bulk_copy_without_a_literal_size_counts_as_a_wide_load():
    """``cp.async.bulk`` moves a register-held byte count that the PTX ISA requires to be a multiple of 16: it is
    no narrow load (kills the mutation of the unparsed-size fallback from 16 to 4)."""
    text = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd2], %r3, [%r4];"
    assert _load_width(text) == 16


@pytest.mark.parametrize(
    "text,width",
    [
        # PTX ISA 7.8+: ``.shared{::cta}``; the cp-size operand is 4 bytes whatever the spelling
        ("cp.async.ca.shared::cta.global [ $0 + 0 ], [ $1 + 0 ], 0x4, $2;", 4),
        ("cp.async.ca.shared::cta.global.L2::128B [ $0 + 0 ], [ $1 + 0 ], 8;", 8),
        # PTX ISA ``ld``: ``ld{.weak, .volatile, .relaxed.scope, .acquire.scope}{.ss}...``: the state space follows
        # the semantics qualifier; Triton's ``tl.load(volatile=True)`` emits ``ld.volatile.global``
        ("ld.volatile.global.b32 { $0 }, [ $1 + 0 ];", 4),
        ("ld.relaxed.gpu.global.v2.b32 { $0, $1 }, [ $2 + 0 ];", 8),
        ("ld.acquire.gpu.global.b16 $0, [ $1 + 0 ];", 2),
        # every semantics and scope the PTX ISA's ``ld`` allows
        ("ld.weak.global.b32 \t%r5, [%rd2];", 4),  # ld{.weak}: the default semantics spelt out
        ("ld.weak.global.v4.b32 \t{%r1, %r2, %r3, %r4}, [%rd2];", 16),
        ("ld.relaxed.cta.global.b32 \t%r5, [%rd2];", 4),
        ("ld.relaxed.cluster.global.b16 \t%rs5, [%rd2];", 2),
        ("ld.relaxed.gpu.global.b64 \t%rd5, [%rd2];", 8),
        ("ld.acquire.sys.global.b32 \t%r5, [%rd2];", 4),
        ("ld.acquire.cluster.global.v2.b32 \t{%r1, %r2}, [%rd2];", 8),
        # LLVM IR writes an inline-asm string's newline and tab as ``\0A\09``: the opcode then follows a digit
        ('asm sideeffect "mov.u32 $0, 0x0;\\0A\\09ld.global.v4.b32 { $0 }, [ $1 + 0 ];", "=r,l"', 16),
        ('asm sideeffect "mov.u32 $0, 0x0;\\0A\\09ld.volatile.global.b32 { $0 }, [ $1 + 0 ];", "=r,l"', 4),
    ],
)
def test_load_width_spellings_the_ptx_isa_allows(text, width):
    # fails on base: ``.shared::cta`` copies fell back to 16 bytes (a 4-byte weight stream passed the 16-byte check);
    # ``ld.volatile.global`` / ``ld.relaxed.gpu.global`` were no loads to the reader (None), so a weight streamed
    # with ``volatile=True`` in 4-byte loads was never reported
    assert _load_width(text) == width


def test_a_volatile_weight_stream_in_a_loop_is_reported():
    load = (
        '%w = tail call i32 asm sideeffect "ld.volatile.global.b32 { $0 }, [ $1 + 0 ];", "=r,l"(ptr addrspace(1) %gep)'
    )
    ir = LOOP_IR.replace("LOAD", load)
    # fails on base: no loop is reported (the 4-byte volatile load of w_ptr is not a load to the reader)
    [loop] = weight_loop_loads(ir, ["w_ptr", "x_ptr", "n"], {"w_ptr"})
    assert [w for w, _ in loop.widths["w_ptr"]] == [4]


@pytest.mark.parametrize(
    "text,width",
    [
        ("load ptr, ptr addrspace(1) %t, align 8", 8),  # nvptx64: a generic pointer is 64 bits
        ("load <2 x ptr>, ptr addrspace(1) %t, align 16", 16),
        ("load <2 x double>, ptr addrspace(1) %t, align 16", 16),
    ],
)
def test_a_pointer_table_load_is_as_wide_as_its_pointers(text, width):
    assert _load_width(text) == width


def test_a_weight_pointer_chosen_by_select_is_traced():
    """A pointer picked by ``select`` (two weights behind one condition) loads from both weights."""
    ir = """define ptx_kernel void @k(ptr addrspace(1) %0, ptr addrspace(1) %1, i1 %2, i32 %3) {
entry:
  %base = select i1 %2, ptr addrspace(1) %0, ptr addrspace(1) %1
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %next, %loop ]
  %off = sext i32 %i to i64
  %gep = getelementptr float, ptr addrspace(1) %base, i64 %off
  %w = load <4 x float>, ptr addrspace(1) %gep, align 16
  %next = add i32 %i, 128
  %done = icmp sge i32 %next, %3
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""
    [loop] = weight_loop_loads(ir, ["a", "b", "c", "n"], {"a", "b"})
    assert {arg: [w for w, _ in v] for arg, v in loop.widths.items()} == {"a": [16], "b": [16]}
