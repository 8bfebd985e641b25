"""Gaps a third mutation audit of ``kernels/offline.py`` found in how weight loads are traced back to the
kernel's arguments, on hand-written LLVM modules (no compile): which ``define`` is the kernel (not always the
first), a weight passed to a helper as a later parameter or from several call sites, and pointers that come
out of inline asm (a ``ld.global`` reads a pointer from memory: ``*table``; any other asm only computes one
from its operands)."""

from __future__ import annotations

import re

from nonstop.kernels.offline import LoopLoads, weight_loop_loads

# inline PTX loads, as Triton emits them: LD_V4(%p) 16 bytes, LD_B32(%p) 4 bytes
_ASM = 'tail call {ty} asm sideeffect "ld.global.{op} {{ {out} }}, [ ${n} + 0 ];", "{cons}"(ptr addrspace(1) \\1)'
_LOADS = {
    "LD_V4": _ASM.format(ty="{ i32, i32, i32, i32 }", op="v4.b32", out="$0, $1, $2, $3", n=4, cons="=r,=r,=r,=r,l"),
    "LD_B32": _ASM.format(ty="i32", op="b32", out="$0", n=1, cons="=r,l"),
}


def _module(text: str) -> str:
    for name, asm in _LOADS.items():
        text = re.sub(rf"{name}\((%[\w.]+)\)", asm, text)
    return text


# A helper defined BEFORE the kernel (Triton's LLVM puts non-inlined callees wherever LLVM likes), taking the
# pointer it loads as its SECOND parameter; the kernel k(x, w, n) calls it with (n, w) and loads w 16 bytes
# wide in a loop of its own. The helper's loop loads 4 bytes.
HELPER_FIRST = _module(
    """define internal void @helper(i32 %0, ptr addrspace(1) %1) {
  br label %3

3:
  %4 = phi i32 [ 0, %2 ], [ %7, %3 ]
  %5 = getelementptr float, ptr addrspace(1) %1, i32 %4
  %6 = LD_B32(%5)
  %7 = add i32 %4, 1
  %8 = icmp slt i32 %7, %0
  br i1 %8, label %3, label %9

9:
  ret void
}

define ptx_kernel void @k(ptr addrspace(1) %0, ptr addrspace(1) %1, i32 %2) {
  br label %4

4:
  %5 = phi i32 [ 0, %3 ], [ %8, %4 ]
  %6 = getelementptr bfloat, ptr addrspace(1) %1, i32 %5
  %7 = LD_V4(%6)
  call void @helper(i32 %2, ptr addrspace(1) %1)
  %8 = add i32 %5, 1
  %9 = icmp slt i32 %8, %2
  br i1 %9, label %4, label %10

10:
  ret void
}
"""
)
NAMES = ["x", "w", "n"]


def test_the_kernel_is_the_ptx_kernel_define_not_the_first_one():
    """With the helper defined first, its parameters must not be taken for the kernel's (the helper's second
    parameter would read as the kernel's second argument ``w`` by position, its loads as the kernel's, and
    the kernel's own loop would trace to nothing): both loops load ``w``, found through the call."""
    assert weight_loop_loads(HELPER_FIRST, NAMES, {"w"}) == [
        LoopLoads("helper:3", {"w": [(4, "?")]}),
        LoopLoads("k:4", {"w": [(16, "?")]}),
    ]
    # x is never loaded: nothing may trace to it (a wrong kernel would make the helper's i32 %0 ``x``)
    assert weight_loop_loads(HELPER_FIRST, NAMES, {"x", "n"}) == []


def test_a_named_kernel_is_the_kernel_even_if_another_is_marked_first():
    """``name`` picks the kernel among several ``ptx_kernel`` defines (a module compiled with a second entry
    point): k2(w, x) passes its first argument to the helper, k(x, w, n) its second."""
    k2 = """
define ptx_kernel void @k2(ptr addrspace(1) %0, ptr addrspace(1) %1) {
  call void @helper(i32 4, ptr addrspace(1) %1)
  ret void
}
"""
    llir = HELPER_FIRST.replace("define ptx_kernel void @k(", k2 + "\ndefine ptx_kernel void @k(")
    # the kernel k2 (its arguments w, x): the helper loads k2's second argument, x; k is no kernel here
    got = weight_loop_loads(llir, ["w", "x"], {"w", "x"}, name="k2")
    assert got == [LoopLoads("helper:3", {"x": [(4, "?")]})]
    got = weight_loop_loads(llir, NAMES, {"w"}, name="k")
    assert got == [LoopLoads("helper:3", {"w": [(4, "?")]}), LoopLoads("k:4", {"w": [(16, "?")]})]


def test_a_helper_called_from_two_sites_loads_what_each_passes():
    """One helper, two calls: the weight its parameter may be is every argument passed at any call site."""
    llir = HELPER_FIRST.replace(
        "  call void @helper(i32 %2, ptr addrspace(1) %1)\n",
        "  call void @helper(i32 %2, ptr addrspace(1) %1)\n  call void @helper(i32 %2, ptr addrspace(1) %0)\n",
    )
    got = weight_loop_loads(llir, NAMES, {"w", "x"})
    assert got[0].header == "helper:3"
    assert {arg: sorted(w) for arg, w in got[0].widths.items()} == {"w": [(4, "?")], "x": [(4, "?")]}


def test_a_short_call_does_not_bind_a_later_parameter():
    """A call site with fewer operands than the helper has parameters (a varargs or mismatched call) binds
    nothing to the missing ones: no IndexError, no weight."""
    llir = HELPER_FIRST.replace("call void @helper(i32 %2, ptr addrspace(1) %1)", "call void @helper(i32 %2)")
    assert weight_loop_loads(llir, NAMES, {"w"}) == [LoopLoads("k:4", {"w": [(16, "?")]})]


# Pointers out of inline asm: %5 a pointer read from the table argument by an ``ld.global.b64`` asm (a pointer
# loaded from memory: ``*table``), %7 the weight pointer passed through a ``mov`` asm (computed, not loaded:
# still ``w``). The kernel is k(w, table, n).
ASM_POINTERS = _module(
    """define ptx_kernel void @k(ptr addrspace(1) %0, ptr addrspace(1) %1, i32 %2) {
  %4 = tail call i64 asm sideeffect "ld.global.b64 $0, [ $1 + 0 ];", "=l,l"(ptr addrspace(1) %1)
  %5 = inttoptr i64 %4 to ptr addrspace(1)
  %6 = tail call i64 asm "mov.b64 $0, $1;", "=l,l"(ptr addrspace(1) %0)
  %7 = inttoptr i64 %6 to ptr addrspace(1)
  br label %8

8:
  %9 = phi i32 [ 0, %3 ], [ %14, %8 ]
  %10 = getelementptr bfloat, ptr addrspace(1) %7, i32 %9
  %11 = LD_V4(%10)
  %12 = getelementptr bfloat, ptr addrspace(1) %5, i32 %9
  %13 = LD_B32(%12)
  %14 = add i32 %9, 1
  %15 = icmp slt i32 %14, %2
  br i1 %15, label %8, label %16

16:
  ret void
}
"""
)


def test_a_pointer_computed_by_inline_asm_is_its_operand():
    """An asm that is not a load (``mov``) passes its operand's root on: the 16-byte loads through it are
    loads of ``w`` (not of ``*w``, a pointer read from memory at w, and not untraced)."""
    assert weight_loop_loads(ASM_POINTERS, ["w", "table", "n"], {"w"}) == [LoopLoads("k:8", {"w": [(16, "?")]})]
    assert weight_loop_loads(ASM_POINTERS, ["w", "table", "n"], {"*w"}) == []


def test_a_pointer_read_by_an_inline_asm_load_is_starred():
    """An ``ld.global`` asm reads a pointer from the table argument: loads through it are ``*table``'s, not
    ``table``'s."""
    assert weight_loop_loads(ASM_POINTERS, ["w", "table", "n"], {"*table"}) == [
        LoopLoads("k:8", {"*table": [(4, "?")]})
    ]
    assert weight_loop_loads(ASM_POINTERS, ["w", "table", "n"], {"table"}) == []


def test_a_pointer_many_steps_from_its_argument_is_still_traced():
    """Real kernels reach a load through long chains (address arithmetic, casts, selects): 24 steps from the
    argument, the load is still the weight's."""
    chain = ["  %4 = getelementptr bfloat, ptr addrspace(1) %0, i32 1"]
    for i in range(5, 28):
        op = (
            "bitcast ptr addrspace(1) %{} to ptr addrspace(1)"
            if i % 2
            else "getelementptr i8, ptr addrspace(1) %{}, i32 2"
        )
        chain.append(f"  %{i} = " + op.format(i - 1))
    llir = _module(
        "define ptx_kernel void @k(ptr addrspace(1) %0, i32 %1) {\n"
        + "\n".join(chain)
        + """
  br label %28

28:
  %29 = LD_V4(%27)
  %30 = icmp slt i32 0, %1
  br i1 %30, label %28, label %31

31:
  ret void
}
"""
    )
    assert weight_loop_loads(llir, ["w", "n"], {"w"}) == [LoopLoads("k:28", {"w": [(16, "?")]})]


def test_named_values_are_traced_like_numbered_ones():
    """LLVM's loop passes name what they make (``%lsr.iv``, ``%scevgep``) and arguments may be named: a weight
    load through a strength-reduced pointer is still the weight's."""
    llir = _module(
        """define ptx_kernel void @k(ptr addrspace(1) %w.ptr, i32 %n) {
entry:
  br label %loop.body

loop.body:
  %lsr.iv = phi ptr addrspace(1) [ %w.ptr, %entry ], [ %scevgep, %loop.body ]
  %v = LD_V4(%lsr.iv)
  %scevgep = getelementptr i8, ptr addrspace(1) %lsr.iv, i64 16
  %c = icmp slt i32 0, %n
  br i1 %c, label %loop.body, label %exit

exit:
  ret void
}
"""
    )
    assert weight_loop_loads(llir, ["w", "n"], {"w"}) == [LoopLoads("k:loop.body", {"w": [(16, "?")]})]


def test_quoted_function_names_are_matched_to_their_calls():
    """``@"helper.x"``: a quoted name is defined and called as the same function (its loads trace to the
    caller's argument), and a quoted kernel name is found by ``name``."""
    llir = HELPER_FIRST.replace("@helper(", '@"helper.x"(').replace("@k(", '@"k.1"(')
    assert weight_loop_loads(llir, NAMES, {"w"}, name="k.1") == [
        LoopLoads("helper.x:3", {"w": [(4, "?")]}),
        LoopLoads("k.1:4", {"w": [(16, "?")]}),
    ]


def test_a_helper_whose_name_starts_with_the_kernels_is_not_the_kernel():
    """``@k_helper`` defined before ``@k``: looking up k's ``define`` line must not stop at k_helper's (the
    kernel would not be recognised, and the first define - the helper - would be taken for it)."""
    llir = HELPER_FIRST.replace("@helper(", "@k_helper(")
    assert weight_loop_loads(llir, NAMES, {"w"}) == [
        LoopLoads("k_helper:3", {"w": [(4, "?")]}),
        LoopLoads("k:4", {"w": [(16, "?")]}),
    ]


def test_both_loads_on_a_pointer_cycle_are_traced_to_the_weight():
    """A loop carries its pointer around: %4 = phi(w, %7), loads at %4 and at %6 = %4 + 8, then %7 = %6 + 8.
    Both loads are w's, whichever is met first: tracing %4 meets %4 again through %7 and %6 while its own
    roots are still unknown, and what %6 got from that partial answer must not stand."""
    for first, second in (("LD_V4(%4)", "LD_B32(%6)"), ("LD_B32(%6)", "LD_V4(%4)")):
        llir = _module(
            f"""define ptx_kernel void @k(ptr addrspace(1) %0, i32 %1) {{
  br label %3

3:
  %4 = phi ptr addrspace(1) [ %0, %2 ], [ %7, %3 ]
  %6 = getelementptr bfloat, ptr addrspace(1) %4, i32 8
  %5 = {first}
  %8 = {second}
  %7 = getelementptr bfloat, ptr addrspace(1) %6, i32 8
  %9 = icmp slt i32 0, %1
  br i1 %9, label %3, label %10

10:
  ret void
}}
"""
        )
        (loop,) = weight_loop_loads(llir, ["w", "n"], {"w"})
        assert sorted(loop.widths["w"]) == [(4, "?"), (16, "?")], first


def test_two_branches_back_to_one_header_are_one_loop():
    """A loop whose body branches back to its header from two blocks (a `continue`) is one loop: each of its
    loads is counted once, not once per back edge."""
    llir = _module(
        """define ptx_kernel void @k(ptr addrspace(1) %0, i32 %1) {
  br label %3

3:
  %4 = phi i32 [ 0, %2 ], [ %7, %3 ], [ %7, %8 ]
  %5 = getelementptr bfloat, ptr addrspace(1) %0, i32 %4
  %6 = LD_V4(%5)
  %7 = add i32 %4, 1
  %9 = icmp slt i32 %7, %1
  br i1 %9, label %3, label %8

8:
  %10 = icmp slt i32 %7, 100
  br i1 %10, label %3, label %11

11:
  ret void
}
"""
    )
    assert weight_loop_loads(llir, ["w", "n"], {"w"}) == [LoopLoads("k:3", {"w": [(16, "?")]})]
