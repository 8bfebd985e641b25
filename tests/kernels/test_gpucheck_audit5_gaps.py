"""Gaps a fifth mutation audit of the offline GPU check (``kernels/offline.py``, ``kernels/platform.py``) found,
with no compile and no GPU: loops of the LLVM reader whose latch is not the header (a loop closed by a branch
back from a later block, a loop with a ``continue``), pointers that reach a weight only through several phi
cycles, and the PTX spin-wait reader's acquire re-read of the polled address (the label sharing the poll's line,
a plain load of another address inside the loop).

Expected verdicts come from LLVM's and PTX's semantics (a loop is the blocks from a branch target back to the
furthest block that branches to it; PTX memory model: an acquire read synchronises with a release only through
the location the release wrote), not from the code under test."""

from __future__ import annotations

import pytest

from nonstop.kernels.offline import KernelReport, LoopLoads, spin_waits, weight_loop_loads
from tests.kernels.test_gpucheck_audit4_gaps import SPIN, VOLATILE

# ----------------------------------------------------------------------------- LLVM loops

# k(w, n): block 3 is the loop's header (it tests the trip count), block 6 its body: it loads w 4 bytes wide and
# branches back to 3 unconditionally. The branches 3 -> 6 and 3 -> 9 go forward; block 9, after the loop, loads
# w 2 bytes wide once (no loop: it must not be reported).
TWO_BLOCK_LOOP = """define ptx_kernel void @k(ptr addrspace(1) %0, i32 %1) {
  br label %3

3:
  %4 = phi i32 [ 0, %2 ], [ %8, %6 ]
  %5 = icmp slt i32 %4, %1
  br i1 %5, label %6, label %9

6:
  %7 = getelementptr float, ptr addrspace(1) %0, i32 %4
  %l = load float, ptr addrspace(1) %7, align 4
  %8 = add i32 %4, 1
  br label %3

9:
  %10 = load half, ptr addrspace(1) %0, align 2
  ret void
}
"""


def test_a_loop_closed_from_a_later_block_holds_its_body():
    """The back edge is 6 -> 3 (a target before its source); the forward edges 3 -> 6 / 3 -> 9 close nothing.
    The loop is blocks 3..6: the body's 4-byte load is counted, the 2-byte load after the loop is not."""
    assert weight_loop_loads(TWO_BLOCK_LOOP, ["w", "n"], {"w"}) == [LoopLoads("k:3", {"w": [(4, "?")]})]


# k(w, n): a loop 3..9 with a ``continue``: block 6 branches back to 3 early (when %c is set) or on to 9, which
# loads w 2 bytes wide and branches back to 3 as well. Both back edges close ONE loop, the furthest latch (9)
# ends it, so 9's load is inside the loop.
CONTINUE_LOOP = """define ptx_kernel void @k(ptr addrspace(1) %0, i32 %1) {
  br label %3

3:
  %4 = phi i32 [ 0, %2 ], [ %5, %6 ], [ %5, %9 ]
  %5 = add i32 %4, 1
  br label %6

6:
  %7 = and i32 %4, 1
  %c = icmp eq i32 %7, 0
  br i1 %c, label %3, label %9

9:
  %10 = getelementptr half, ptr addrspace(1) %0, i32 %4
  %l = load half, ptr addrspace(1) %10, align 2
  %11 = icmp slt i32 %5, %1
  br i1 %11, label %3, label %12

12:
  ret void
}
"""


def test_a_loop_with_two_branches_back_ends_at_the_furthest():
    """The blocks of the loop headed by 3 run up to 9, the last block that branches back to 3 (not 6, the
    first): the 2-byte load in 9 streams w inside the loop."""
    assert weight_loop_loads(CONTINUE_LOOP, ["w", "n"], {"w"}) == [LoopLoads("k:3", {"w": [(2, "?")]})]


# Four pointer phis and a getelementptr that feed one another in a loop; %v4 is the only one that starts from the
# argument (%0, on entry). Every value of the cycle is therefore a pointer into w: %v1 = %v3 + 4 bytes, %v3 is %v4
# or %v1, %v4 is %0 or %v2, %v2 is %v3 or %v0, %v0 is %v2 or %v4. Both loads (through %v4 and through %v1) read w.
PHI_CYCLES = """define ptx_kernel void @k(ptr addrspace(1) %0) {
  br label %3

3:
  %v0 = phi ptr addrspace(1) [ %v2, %3 ], [ %v4, %3 ]
  %v1 = getelementptr float, ptr addrspace(1) %v3, i32 1
  %v2 = phi ptr addrspace(1) [ %v3, %3 ], [ %v0, %3 ]
  %v3 = phi ptr addrspace(1) [ %v4, %3 ], [ %v1, %3 ]
  %v4 = phi ptr addrspace(1) [ %0, %1 ], [ %v2, %3 ]
  %l0 = load float, ptr addrspace(1) %v4, align 4
  %l1 = load float, ptr addrspace(1) %v1, align 4
  br i1 %c, label %3, label %9

9:
  ret void
}
"""


def test_a_pointer_reaching_its_argument_through_nested_phi_cycles_is_traced():
    """Each of the two 4-byte loads is a load of w (the roots must be grown to their fixpoint, not stopped
    after a pass or two that still hold a cycle's partial answer)."""
    assert weight_loop_loads(PHI_CYCLES, ["w"], {"w"}) == [LoopLoads("k:3", {"w": [(4, "?"), (4, "?")]})]


# ----------------------------------------------------------------------------- PTX: the acquire re-read after a spin

REREAD = "\tld.acquire.gpu.global.b32 \t%r8, [%rd2];"


def _spin(after: str, poll: str = VOLATILE, labelled: bool = False) -> list[bool]:
    text = SPIN.replace("\nPOLL", poll if labelled else "\n" + poll).replace("AFTER", after)
    return [s["acquire"] for s in spin_waits(text)]


def test_a_re_read_of_a_poll_sharing_the_label_line_is_an_acquire():
    """``$L__BB0_1: ld.volatile.global.b32 %r5, [%rd2];`` polls [%rd2] (the label is no part of the instruction):
    an acquire of [%rd2] after the loop reads the flag's released value and orders what follows."""
    assert _spin(REREAD, labelled=True) == [True]


def test_a_plain_load_in_the_loop_is_no_polled_address():
    """The loop also reads [%rd4] with a weak load (no poll: a compiler may hoist it); the loop exits on the
    volatile poll of [%rd2]. An acquire of [%rd4] after the loop synchronises with no release the poll saw."""
    poll = VOLATILE + "\n\tld.global.b32 \t%r6, [%rd4];"
    assert _spin("\tld.acquire.gpu.global.b32 \t%r8, [%rd4];", poll=poll) == [False]


@pytest.mark.parametrize("fence", ["\tfence.acq_rel.gpu;", "\tfence.sc.sys;", "\tmembar.gl;", "\tmembar.sys;"])
def test_a_fence_after_the_loop_needs_no_address(fence):
    """A fence after the (morally strong) poll orders what follows it whatever the poll read: it has no address
    operand to match."""
    assert _spin(fence) == [True]


@pytest.mark.parametrize(
    ("poll", "after", "want"),
    [
        # the address register moves on after the poll, inside the loop: at the exit it names the NEXT word
        (VOLATILE + "\n\tadd.s64 \t%rd2, %rd2, 4;", REREAD, [False]),
        # the address register is rewritten between the loop and the acquire: another location
        (VOLATILE, "\tadd.s64 \t%rd2, %rd2, 64;\n" + REREAD, [False]),
        (VOLATILE, "\tmov.u64 \t%rd2, %rd9;\n" + REREAD, [False]),
        # the same location, spelled with a zero offset (Triton's inline asm writes ``[ $1 + 0 ]``)
        (VOLATILE, "\tld.acquire.gpu.global.b32 \t%r8, [ %rd2 + 0 ];", [True]),
        ("\tld.volatile.global.b32 \t%r5, [ %rd2 + 0 ];", REREAD, [True]),
    ],
    ids=["moved-in-loop", "moved-after-loop", "replaced-after-loop", "re-read-plus-0", "poll-plus-0"],
)
def test_the_re_read_must_be_of_the_location_polled_at_the_exit(poll, after, want):
    """The acquire orders the relaxed poll only if it reads the location the poll read when the loop exited (PTX
    memory model: it then reads the release's value or a later one of its release sequence). Which location that
    is depends on the register's value, not its name: a register written after the poll names another location,
    and ``[%rd2+0]`` is ``[%rd2]``. Every line assembles with ptxas for sm_90a."""
    # fails on base: addresses are compared as text, so a rewritten %rd2 still matches and [%rd2+0] does not
    assert _spin(after, poll=poll) == want


# k(w, n): the loop's pointer is computed in integers - ``ptrtoint`` w, OPS, ``inttoptr`` - and loaded 4 bytes wide.
# Every OPS keeps the value an address inside w (aligned down, advanced, narrowed to 32 bits and widened back), so
# the load streams w (the module docstring: pointers are followed back through casts and integer arithmetic).
TO_INT = "  %a = ptrtoint ptr addrspace(1) %0 to i64"
FROM_INT = "  %p = inttoptr i64 %z to ptr addrspace(1)\n  %l = load float, ptr addrspace(1) %p, align 4"
INT_POINTER = """define ptx_kernel void @k(ptr addrspace(1) %0, i32 %1) {
  br label %3

3:
  %4 = phi i32 [ 0, %2 ], [ %8, %3 ]
BODY
  %8 = add i32 %4, 1
  %9 = icmp slt i32 %8, %1
  br i1 %9, label %3, label %10

10:
  ret void
}
"""


@pytest.mark.parametrize(
    "ops",
    [
        "  %z = and i64 %a, -16",
        "  %z = add i64 %a, 64",
        "  %t = trunc i64 %a to i32\n  %z = zext i32 %t to i64",
        "  %t = trunc i64 %a to i32\n  %z = sext i32 %t to i64",
    ],
    ids=["and", "add", "zext", "sext"],
)
def test_a_pointer_computed_in_integers_is_traced_to_its_argument(ops):
    to_int = "  %a = ptrtoint ptr addrspace(1) %0 to i64"
    load = "  %p = inttoptr i64 %z to ptr addrspace(1)\n  %l = load float, ptr addrspace(1) %p, align 4"
    ir = INT_POINTER.replace("BODY", f"{to_int}\n{ops}\n{load}")
    assert weight_loop_loads(ir, ["w", "n"], {"w"}) == [LoopLoads("k:3", {"w": [(4, "?")]})]


# k(table, n): inline asm reads two 64-bit pointers from the table (a struct result); the first, taken out with
# ``extractvalue`` and cast to a pointer, is loaded 2 bytes wide in the loop: a load through ``*table``.
TABLE_PAIR = INT_POINTER.replace(
    "BODY",
    '  %r = tail call { i64, i64 } asm sideeffect "ld.global.v2.b64 { $0, $1 }, [ $2 + 0 ];", '
    """"=l,=l,l"(ptr addrspace(1) %0)
  %e = extractvalue { i64, i64 } %r, 0
  %p = inttoptr i64 %e to ptr addrspace(1)
  %l = load half, ptr addrspace(1) %p, align 2""",
)


def test_a_pointer_taken_out_of_an_asm_struct_result_is_traced_to_its_table():
    """The 2-byte load reads through a pointer the asm loaded from ``table``: it streams ``*table`` (the asm's own
    16-byte read of the table is a load of ``table`` itself)."""
    assert weight_loop_loads(TABLE_PAIR, ["table", "n"], {"*table"}) == [LoopLoads("k:3", {"*table": [(2, "?")]})]


# Three spin loops: two whose label shares its line with the poll - a guarded volatile poll under a label with a
# ``$`` in it (PTX identifiers may hold ``$`` after the first character), a relaxed poll with an L1 eviction hint
# - and the same hinted poll on a line of its own (``L1::`` is a qualifier, not a label). ptxas (sm_90a)
# assembles this kernel as written.
LABELLED_POLLS = """.visible .entry k(.param .u64 k_param_0, .param .u32 k_param_1)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<10>;
	.reg .b64 	%rd<4>;
	ld.param.u64 	%rd2, [k_param_0];
	ld.param.u32 	%r1, [k_param_1];
	setp.ne.s32 	%p2, %r1, 0;
spin$1: @%p2 ld.volatile.global.b32 	%r5, [%rd2];
	setp.lt.s32 	%p1, %r5, %r1;
	@%p1 bra 	spin$1;
$L__BB0_2: ld.relaxed.gpu.global.L1::evict_last.b32 	%r6, [%rd2];
	setp.lt.s32 	%p1, %r6, %r1;
	@%p1 bra 	$L__BB0_2;
$L__BB0_3:
	ld.relaxed.gpu.global.L1::evict_last.b32 	%r6, [%rd2];
	setp.lt.s32 	%p1, %r6, %r1;
	@%p1 bra 	$L__BB0_3;
	ld.global.b32 	%r7, [%rd3];
	ret;
}
"""


def test_labelled_polls_in_other_spellings_are_spin_waits():
    """Each loop polls global memory with a relaxed read (``.volatile`` is ``.relaxed.sys``) and nothing acquires
    after it before the next global read: three spin-waits, none ordered."""
    assert [(s["label"], s["acquire"]) for s in spin_waits(LABELLED_POLLS)] == [
        ("spin$1", False),
        ("$L__BB0_2", False),
        ("$L__BB0_3", False),
    ]


# ----------------------------------------------------------------------------- the report's decisions


def _report(**kw) -> KernelReport:
    base = dict(
        name="k", num_warps=4, registers=64, spill_bytes=0, shared_bytes=0, ctas_per_sm=8, grid=None,
        weight_loads={}, side_loads={}, spins=[],
    )  # fmt: skip
    return KernelReport(**{**base, **kw})


def test_a_narrow_weight_stream_names_each_place_it_loads_narrow_once():
    """Two places load w narrow (one of them twice), one loads it 16 bytes wide: one violation for w that names
    both narrow places, each once, and not the wide one."""
    loads = {"w": [(8, "b.py:2"), (4, "a.py:1"), (16, "c.py:3"), (8, "b.py:2")]}
    [msg] = _report(weight_loads=loads).violations
    assert msg.count("a.py:1") == 1 and msg.count("b.py:2") == 1 and "c.py:3" not in msg


def test_inspect_asks_ptxas_for_the_targets_architecture(monkeypatch):
    """The register count must come from ptxas run for the GPU being checked: a Target of another architecture
    (sm_100) gets its own ``--gpu-name``, not sm_90's; a target with no architecture (the interpreter) is read as
    sm_90, the GPUs the check is for."""
    from types import SimpleNamespace

    from nonstop.kernels import offline
    from nonstop.kernels.platform import INTERPRETER, Target

    asked = []

    def usage(ptx, arch=90, fp_fusion=True):
        asked.append(arch)
        return {"registers": 32, "spill_store_bytes": 0, "spill_load_bytes": 0, "stack_bytes": 0}

    monkeypatch.setattr(offline, "ptxas_usage", usage)
    kernel = SimpleNamespace(
        metadata=SimpleNamespace(num_warps=4, shared=0),
        asm={"ptx": "", "llir": "define ptx_kernel void @k() {\n  ret void\n}\n"},
    )
    offline.inspect(kernel, [], set(), "k", target=Target("B200", gpu=True, sms=148, arch=100))
    offline.inspect(kernel, [], set(), "k", target=INTERPRETER)
    assert asked == [100, 90]


def test_compile_launch_keeps_launch_pdl_out_of_the_compile_options():
    """``launch_pdl`` (programmatic dependent launch) is an attribute of a launch, not a compile option: the
    kernel is compiled (warmup, binder) with the other options only, and the runtime parameter names are the
    non-constexpr entries of the signature in order."""
    pytest.importorskip("triton")
    from nonstop.kernels import offline

    seen = []

    class FakeJit:
        def warmup(self, grid, **kw):
            seen.append(("warmup", kw))
            return "kernel"

        def binder(self, **kw):
            seen.append(("binder", kw))
            return "bound", "spec", "opts"

        def _pack_args(self, backend, options, bound, specialization, opts):
            seen.append(("pack", options))
            return None, {"x_ptr": "*fp32", "BLOCK": "constexpr", "n": "i32"}, None, None

    fn = FakeJit()
    fn.device_caches = {0: (None, None, None, "backend", fn.binder)}
    kernel, names = offline.compile_launch(fn, {"x_ptr": 0, "n": 4}, {"num_warps": 4, "launch_pdl": True})
    assert (kernel, names) == ("kernel", ["x_ptr", "n"])
    assert seen == [
        ("warmup", {"x_ptr": 0, "n": 4, "num_warps": 4}),
        ("binder", {"x_ptr": 0, "n": 4, "num_warps": 4}),
        ("pack", {"num_warps": 4}),
    ]
