"""Gaps a fifth mutation audit of ``kernels/offline.py`` found (``_load_width``, ``spin_waits``). No compile, no GPU.
Expected widths follow the PTX ISA's ``ld`` syntax (ld{.weak}, ld.volatile, ld.relaxed.scope, ld.acquire.scope,
ld.mmio.relaxed.sys{.global}; .scope = .cta | .cluster | .gpu | .sys) and the type's bit width, not the code."""

from __future__ import annotations

import pytest

from nonstop.kernels.offline import _load_width


@pytest.mark.parametrize("ty, width", [("b32", 4), ("u64", 8), ("b8", 1)])
def test_an_mmio_load_is_a_global_load(ty, width):
    """PTX ISA: ``ld.mmio.relaxed.sys{.global}.type d, [a];`` - the only spelling of an mmio load."""
    # fails on base: the reader allows one qualifier before .global, so ld.mmio.relaxed.sys.global is None
    assert _load_width(f"ld.mmio.relaxed.sys.global.{ty} \t%r5, [%rd2];") == width


@pytest.mark.parametrize(
    "text",
    [
        "xld.global.b32 \t%r5, [%rd2];",  # an opcode that only ends in "ld"
        "my_ld.global.b32 \t%r5, [%rd2];",
        "foo.ld.global.b32 \t%r5, [%rd2];",
    ],
)
def test_ld_inside_a_longer_name_is_no_load(text):
    """The opcode must be ``ld`` itself (after a digit it may be: LLVM's ``\\0A\\09``), not a name ending in it."""
    assert _load_width(text) is None
    assert _load_width('asm sideeffect "mov.u32 $0, 0x0;\\0A\\09ld.global.b32 { $0 }, [ $1 + 0 ];"') == 4


# ----------------------------------------------------------------------------- spin_waits: the after-loop acquire

from nonstop.kernels.offline import spin_waits  # noqa: E402

SPIN = """
$L__BB0_1:
POLL
\tsetp.lt.s32 \t%p1, %r5, %r1;
\t@%p1 bra \t$L__BB0_1;
AFTER
\tld.global.b32 \t%r7, [%rd3];
\tret;
"""
VOLATILE = "\tld.volatile.global.b32 \t%r5, [%rd2];"


def _spin(after: str = "", poll: str = VOLATILE) -> list[bool]:
    return [s["acquire"] for s in spin_waits(SPIN.replace("POLL", poll).replace("AFTER", after))]


@pytest.mark.parametrize(
    ("after", "ordered"),
    [
        ("\tld.acquire.gpu.global.b32 \t%r9, [%rd2];", True),  # re-reads the polled word
        ("\tld.acquire.gpu.global.b32 \t%r9, [ %rd2 ];", True),  # the same operand, spaced as Triton's asm
        ("\tld.acquire.sys.global.b32 \t%r9, [%rd2];", True),
        ("\tatom.acquire.gpu.global.add.u32 \t%r9, [%rd2], 0;", True),
        ("\tld.acquire.gpu.global.b32 \t%r9, [%rd4];", False),  # another address: orders nothing about the poll
        ("\tld.acquire.cta.global.b32 \t%r9, [%rd2];", False),  # a CTA-scope acquire: not morally strong
        ("\tld.relaxed.gpu.global.b32 \t%r9, [%rd2];", False),  # no acquire at all
        ("\tfence.acq_rel.gpu;", True),  # a fence needs no address
        ("\tmembar.gl;", True),
        ("\tmembar.cta;", False),
        ("\tfence.proxy.async;", False),
    ],
)
def test_what_after_the_loop_orders_the_wait(after, ordered):
    assert _spin(after=after) == [ordered]


def test_the_polled_address_is_read_from_the_poll_not_from_other_loop_lines():
    """Only the poll's address counts: a plain load of [%rd4] in the loop does not make an acquire of [%rd4]
    after it an ordering re-read of the polled word."""
    body = VOLATILE + "\n\tld.global.nc.b32 \t%r8, [%rd4];"
    text = SPIN.replace("POLL", body).replace("AFTER", "\tld.acquire.gpu.global.b32 \t%r9, [%rd4];")
    assert [s["acquire"] for s in spin_waits(text)] == [False]


def test_a_poll_sharing_its_labels_line_gives_its_address():
    """``$L__BB0_1: ld.volatile...`` (ptxas accepts a label and an instruction on one line): that poll's address
    is the polled one, so an acquire re-read of it after the loop orders the wait."""
    text = SPIN.replace("$L__BB0_1:\nPOLL", "$L__BB0_1: " + VOLATILE.strip()).replace(
        "AFTER", "\tld.acquire.gpu.global.b32 \t%r9, [%rd2];"
    )
    assert [s["acquire"] for s in spin_waits(text)] == [True]


def test_an_acquire_of_the_same_address_plus_zero_is_a_re_read():
    """``[%rd2+0]`` is ``[%rd2]`` (PTX register-plus-offset addressing); Triton's own asm spells its loads so."""
    # fails on base: the addresses are compared as text, "%rd2+0" != "%rd2", so the ordered wait is reported
    assert _spin(after="\tld.acquire.gpu.global.b32 \t%r9, [%rd2+0];") == [True]


def test_an_acquire_of_shared_memory_does_not_order_a_global_wait():
    """``ld.acquire.gpu.shared`` reads shared memory: another location than the polled global word, whatever the
    register spelling, so it cannot synchronise with the releasing CTA (PTX memory model)."""
    # fails on base: the address text matches the poll's, and the state space is not looked at
    assert _spin(after="\tld.acquire.gpu.shared.b32 \t%r9, [%rd2];") == [False]


# ----------------------------------------------------------------------------- roots: pointers read by any ld spelling

from nonstop.kernels.offline import LoopLoads, weight_loop_loads  # noqa: E402
from tests.kernels.test_offline_tracing_gaps import ASM_POINTERS  # noqa: E402

TABLE_LOAD = '"ld.global.b64 $0, [ $1 + 0 ];"'


@pytest.mark.parametrize(
    "load",
    [
        '"ld.volatile.global.b64 $0, [ $1 + 0 ];"',
        '"ld.relaxed.gpu.global.b64 $0, [ $1 + 0 ];"',
        '"ld.acquire.sys.global.b64 $0, [ $1 + 0 ];"',
        '"ld.global.nc.L1::evict_last.b64 $0, [ $1 + 0 ];"',
        '"mov.u64 $0, 0x0;\\0A\\09ld.global.b64 $0, [ $1 + 0 ];"',  # LLVM's escaped newline and tab before ld
    ],
)
def test_a_pointer_read_by_any_global_ld_spelling_is_starred(load):
    """Whatever its semantics qualifier, an asm ``ld ... .global`` reads the pointer from memory at ``table``:
    the loads through it are ``*table``'s (PTX ISA ``ld`` grammar)."""
    assert TABLE_LOAD in ASM_POINTERS
    llir = ASM_POINTERS.replace(TABLE_LOAD, load)
    assert weight_loop_loads(llir, ["w", "table", "n"], {"*table"}) == [LoopLoads("k:8", {"*table": [(4, "?")]})]
    assert weight_loop_loads(llir, ["w", "table", "n"], {"table"}) == []


def test_an_asm_whose_opcode_only_ends_in_ld_is_no_load():
    """``xld.global`` is not ``ld``: its result is computed from its operand (``table``), not loaded (``*table``)."""
    llir = ASM_POINTERS.replace(TABLE_LOAD, '"xld.global.b64 $0, [ $1 + 0 ];"')
    assert weight_loop_loads(llir, ["w", "table", "n"], {"*table"}) == []
    assert weight_loop_loads(llir, ["w", "table", "n"], {"table"}) == [LoopLoads("k:8", {"table": [(4, "?")]})]
