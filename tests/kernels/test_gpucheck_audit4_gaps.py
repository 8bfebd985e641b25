"""Gaps a fourth mutation audit of ``nonstop gpucheck`` found: the spin-wait reader's view of PTX state spaces,
guards, braces and inner labels (``kernels/offline.py``), and what the command reports (``commands/gpucheck.py``).
No compile, no GPU. Every PTX line used here was assembled by the ptxas shipped with Triton for sm_90a (it accepts
them); expected verdicts follow the PTX ISA (state spaces, the memory model's scopes, proxy fences), not the code
under test."""

from __future__ import annotations

import json

import pytest

from nonstop.kernels.offline import spin_waits
from nonstop.runtime import gpucheck

SPIN = """
$L__BB0_1:
POLL
	setp.lt.s32 	%p1, %r5, %r1;
	@%p1 bra 	$L__BB0_1;
AFTER
	ld.global.b32 	%r7, [%rd3];
	ret;
"""
VOLATILE = "\tld.volatile.global.b32 \t%r5, [%rd2];"


def _spin(after: str = "", poll: str = VOLATILE, body: str = "") -> list[bool]:
    text = SPIN.replace("POLL", poll + ("\n" + body if body else "")).replace("AFTER", after)
    return [s["acquire"] for s in spin_waits(text)]


# ----------------------------------------------------------------------------- what is a poll, what is a global read


def test_a_poll_under_a_negated_guard_is_a_poll():
    """``@!%p2 ld.volatile.global`` is the same poll as ``@%p2 ...`` (PTX: a guard predicate may be negated)."""
    assert _spin(poll="\t@!%p2 ld.volatile.global.b32 \t%r5, [%rd2];") == [False]
    assert _spin(poll="\t@!%p2 atom.global.acquire.gpu.add.u32 \t%r5, [%rd2], 0;") == [True]


def test_a_volatile_shared_memory_poll_is_no_spin_wait_on_other_ctas():
    """A loop that polls shared memory waits on the threads of its own CTA: not a wait on global memory."""
    assert _spin(poll="\tld.volatile.shared.b32 \t%r5, [%r4];") == []
    assert _spin(poll="\tld.volatile.shared::cta.b32 \t%r5, [%r4];") == []


def test_a_store_to_local_or_shared_memory_keeps_the_loop_a_spin_wait():
    """Only a store that may reach global memory makes the loop do work others see."""
    assert _spin(body="\tst.local.b32 \t[%rd9], %r5;") == [False]
    assert _spin(body="\tst.shared::cta.b32 \t[%r4], %r5;") == [False]
    assert _spin(body="\tst.b32 \t[%rd9], %r5;") == []  # generic addressing: may be global


@pytest.mark.parametrize(
    "read",
    [
        "ld.param.u64 \t%rd9, [k_param_0];",  # kernel parameters
        "ld.const.b32 \t%r9, [%rd9];",  # the constant bank
        "ld.local.b32 \t%r9, [%rd9];",
        "ld.shared::cta.b32 \t%r9, [%r4];",  # the state space with its sub-qualifier (PTX 7.8+)
        # a shared::cta -> shared::cluster bulk copy reads no global memory
        "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%r4], [%r4], 16, [%r4];",
    ],
)
def test_a_read_of_another_state_space_before_the_fence_is_no_global_read(read):
    """Between the loop and the fence a read that cannot touch global memory needs no ordering: the fence still
    orders every global read after it."""
    assert _spin(f"\t{read}\n\tfence.acq_rel.gpu;") == [True]


def test_an_ldu_between_the_loop_and_the_fence_is_a_global_read():
    """``ldu.global`` reads global memory like ``ld.global``: a fence after it does not order it."""
    assert _spin("\tldu.global.b32 \t%r9, [%rd4];\n\tfence.acq_rel.gpu;") == [False]


def test_a_tensormap_proxy_acquire_fence_is_no_acquire():
    """``fence.proxy.tensormap::generic.acquire.gpu`` orders the tensormap proxy's accesses, not the generic loads
    that follow the wait (PTX ISA, membar/fence: proxy fences), even at ``.gpu`` scope."""
    assert _spin("\tfence.proxy.tensormap::generic.acquire.gpu [%rd2], 128;") == [False]


# ----------------------------------------------------------------------------- the body count: instructions only


def test_braces_and_inner_labels_are_not_instructions():
    """``max_body`` counts instructions: a loop of exactly 60 instructions is a spin-wait however many inline-asm
    braces and block labels lie among them (Triton wraps each inline asm in ``{`` / ``}``; a loop over several
    blocks has inner labels)."""
    filler = "".join(f"\t{{\n\tadd.s32 \t%r{20 + k}, %r{20 + k}, 1;\n\t}}\n" for k in range(27))
    filler += "".join(f"$L__BB0_{10 + k}:\n\tadd.s32 \t%r{50 + k}, %r{50 + k}, 1;\n" for k in range(30))
    # 3 (poll, setp, bra) + 27 + 30 = 60 instructions, 54 brace lines, 30 labels
    assert _spin(body=filler.rstrip("\n")) == [False]
    one_more = filler + "\tadd.s32 \t%r90, %r90, 1;"
    assert _spin(body=one_more) == []


def test_a_cluster_scoped_acquire_poll_does_not_order_a_wait_on_other_ctas():
    """The CTAs a wait synchronises need not share a cluster: ``ld.acquire.cluster`` is not morally strong with a
    release on another cluster's CTA (PTX memory model, scopes)."""
    assert _spin(poll="\tld.acquire.cluster.global.b32 \t%r5, [%rd2];") == [False]
    assert _spin(poll="\tatom.acquire.cluster.global.add.u32 \t%r5, [%rd2], 0;") == [False]


def test_an_unconditional_uniform_branch_back_closes_a_loop():
    """Triton writes a loop's unconditional back edge as ``bra.uni``: the loop is a spin-wait all the same."""
    text = SPIN.replace("@%p1 bra \t$L__BB0_1;", "@%p1 bra \t$L__BB0_2;\n\tbra.uni \t$L__BB0_1;\n$L__BB0_2:")
    assert [s["acquire"] for s in spin_waits(text.replace("AFTER", "").replace("POLL", VOLATILE))] == [False]


def test_an_asm_spin_inlined_twice_is_two_spin_waits():
    """The same inline-asm label appears once per inlined copy; each branch closes the loop of the nearest label
    above it, so the second copy is checked on its own (here it alone is followed by a fence)."""
    block = "spin:\n\tld.volatile.global.b32 \t%r5, [%rd2];\n\tsetp.lt.s32 \t%p1, %r5, %r1;\n\t@%p1 bra \tspin;\n"
    text = block + "\tld.global.b32 \t%r7, [%rd3];\n" + block + "\tfence.acq_rel.gpu;\n\tld.global.b32 \t%r8, [%rd3];\n"
    assert [(s["label"], s["acquire"]) for s in spin_waits(text)] == [("spin", False), ("spin", True)]


# ----------------------------------------------------------------------------- the command's report

ROW = dict(
    shape="k3-nano", kernel="embed:embed_kernel", warps=1, registers=20, spill_bytes=0, shared_bytes=0,
    ctas_per_sm=8, grid=1, load_widths="16", spins=0, violations=[],
)  # fmt: skip


def test_the_json_report_echoes_the_rows_and_gpu_asked_for(monkeypatch, capsys):
    """--json says what was checked: the --rows and --gpu given, not the defaults."""
    from nonstop.cli import main

    monkeypatch.setattr(gpucheck, "run_check", lambda shapes, **kw: {"triton": "9.9", "rows": [ROW]})
    assert main(["gpucheck", "-m", "k3-nano", "--rows", "5", "--gpu", "h200", "--json", "-q"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 5 and report["gpu"] == "h200" and report["arch"] == "sm_90a"
    assert report["violations"] == [] and report["failures"] == []


@pytest.mark.parametrize("mode", ["--json", "table"])
def test_every_violation_of_every_triton_is_counted(mode, monkeypatch, capsys, tmp_path):
    """Two violations of one row, and one found only under the second --triton, are all reported and set status 1
    (a violation under the GPU machines' Triton alone must not pass)."""
    from nonstop.cli import main

    def check(shapes, triton_path=None, **kwargs):
        if triton_path:
            return {"triton": "3.6.0", "rows": [{**ROW, "violations": ["k: the spin-wait at spin has no acquire"]}]}
        return {"triton": "9.9", "rows": [{**ROW, "violations": ["k: 8 bytes of register spills", "k: b"]}]}

    monkeypatch.setattr(gpucheck, "run_check", check)
    monkeypatch.setattr(gpucheck, "triton_in", lambda path: "3.6.0")
    (tmp_path / "t36" / "triton").mkdir(parents=True)
    argv = ["gpucheck", "-m", "k3-nano", "--triton", str(tmp_path / "t36"), "-q"]
    status = main([*argv, "--json"] if mode == "--json" else argv)
    out = capsys.readouterr().out
    assert status == 1
    wanted = ["k: 8 bytes of register spills", "k: b", "k: the spin-wait at spin has no acquire"]
    if mode == "--json":
        assert json.loads(out)["violations"] == wanted
    else:
        assert out.rstrip().endswith("3 violation(s)"), out

    monkeypatch.setattr(gpucheck, "run_check", lambda shapes, triton_path=None, **kw: check(shapes, triton_path)
                        if triton_path else {"triton": "9.9", "rows": [ROW]})  # fmt: skip
    assert main(argv) == 1  # the second Triton's violation alone
    capsys.readouterr()


def test_a_loop_that_polls_nothing_is_no_spin_wait():
    """A loop of plain (weak) global loads streams data; it polls nothing and needs no acquire."""
    assert _spin(poll="\tld.global.b32 \t%r5, [%rd2];") == []


@pytest.mark.parametrize("end", ["\tret;", "\texit;"])
def test_a_fence_after_the_function_returns_does_not_order_the_spin(end):
    """After an unguarded ``ret`` / ``exit`` the path from the loop ends: a fence in a later block (reached only by
    another branch) does not order it."""
    assert _spin(f"{end}\n$L__BB0_3:\n\tfence.acq_rel.gpu;") == [False]


def test_the_scan_after_the_loop_stops_at_the_next_entry():
    """A fence in the next kernel (``.visible .entry``, after this one's closing brace) orders nothing here, even when
    this function's text ends in a branch rather than ``ret``."""
    after = "\tbra.uni \t$L__BB0_5;\n}\n\n.visible .entry other()\n{\n\tfence.acq_rel.gpu;"
    assert _spin(after) == [False]


@pytest.mark.parametrize(
    ("poll", "want"),
    [
        ("\tld.volatile.global.b32 \t%r5, [%rd2];", [False]),
        ("\tatom.global.acquire.gpu.add.u32 \t%r5, [%rd2], 0;", [True]),
    ],
)
def test_a_poll_sharing_its_line_with_the_loop_label_is_checked(poll, want):
    """``$L__BB0_1: ld.volatile.global ...`` (ptxas accepts an instruction after its label on one line) is the
    loop's first instruction: the loop is a spin-wait to check, not skipped as if the line held only a label."""
    # fails on base: a labelled poll line was read as a label alone, so the loop polled nothing and spin_waits gave []
    text = SPIN.replace("$L__BB0_1:\nPOLL", "$L__BB0_1:" + poll).replace("AFTER", "")
    assert [s["acquire"] for s in spin_waits(text)] == want


@pytest.mark.parametrize(
    ("after", "want"),
    [
        ("\tld.acquire.gpu.global.b32 \t%r8, [%rd9];", [False]),  # another address: no release is read there
        ("\tatom.acquire.gpu.global.add.u32 \t%r8, [%rd9], 0;", [False]),
        ("\tld.acquire.gpu.global.b32 \t%r8, [ %rd2 ];", [True]),  # the polled flag again: its release's value
        ("\tld.acquire.gpu.shared.b32 \t%r8, [%r4];", [False]),  # shared memory holds no other CTA's release
    ],
)
def test_an_acquire_after_the_loop_orders_only_a_re_read_of_the_polled_address(after, want):
    """PTX memory model: an acquire synchronises with the release whose value (or a later one in its release
    sequence) it reads, so only an acquire of the polled location orders what follows a relaxed poll; a fence is
    the pattern that needs no address (``fence.acq_rel`` after the strong read)."""
    # fails on base: any gpu-scope acquire after the loop, of any address or state space, was taken as the acquire
    assert _spin(after=after) == want
