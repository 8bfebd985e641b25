"""The generated megakernel's own loop and argument loading, run under the interpreter on hand-made tables.

The interpreter runs the kernel's programs one after another, so a spin-wait whose target is too low never
shows there: every producer already finished. These tests look at the waits the kernel loop issues (its
``wait_at_least`` swapped for a recorder) and compare each (counter, target) with the wait table by hand:
target = step * per_step + base. Task bodies are a tiny tile function defined here that stores what it was
called with, so each class's table slots, strides, uniform constants and PHASE are checked too.
"""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from nonstop.runtime.megakernel.codegen import source  # noqa: E402
from nonstop.runtime.megakernel.codegen.plan import Param, TaskClass  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs under the interpreter")

NUM_FIELDS = 7


def _launch(module, tasks, waits, counters, state, ticket, ptrs=None, wptrs=None, ints=None, floats=None, steps=1):
    z = torch.zeros(4, dtype=torch.int64)
    module.megakernel[(2,)](
        torch.tensor(tasks, dtype=torch.int32),
        torch.tensor(waits, dtype=torch.int32),
        torch.zeros(len(tasks), 2, dtype=torch.int64),
        counters,
        ticket,
        state,
        z if ptrs is None else ptrs,
        z if wptrs is None else wptrs,
        z if ints is None else ints,
        torch.zeros(4) if floats is None else floats,
        len(tasks),
        steps,
        NUM_FIELDS=NUM_FIELDS,
        PREFETCH_LINES=4,
    )


def test_each_wait_targets_all_of_its_steps_increments_of_the_right_counter():
    """Two steps (3 and 4) in one launch; each task's waits are polled on the counter its row names with
    target step * per_step + base. Catches a too-low target (base or epoch scaling dropped, columns swapped:
    a race on a GPU that the interpreter hides), a wait on the wrong counter, and a task releasing the
    wrong counter."""
    module = source.load_source("gaps_protocol", source.megakernel_source([], 1, 1, 1))
    seen = []
    counters = torch.tensor([30, 40, 50], dtype=torch.int64)

    def record(counter_ptr, target):
        addr = int(counter_ptr.handle.data.reshape(-1)[0])
        seen.append(((addr - counters.data_ptr()) // 8, int(target.handle.data.reshape(-1)[0])))

    original, module.wait_at_least = module.wait_at_least, record
    try:
        # rows: opcode (-1: no class), instance, tile, ntiles, counter, waits begin, waits end
        tasks = [[-1, 0, 0, 1, 2, 0, 0], [-1, 0, 0, 1, 0, 0, 1], [-1, 0, 0, 1, 1, 1, 3]]
        waits = [[2, 5, 7], [0, 11, 13], [1, 0, 3]]  # (counter, base, per_step)
        N = len(tasks)
        state = torch.tensor([3, 0], dtype=torch.int64)
        ticket = torch.tensor([3 * N], dtype=torch.int64)
        _launch(module, tasks, waits, counters, state, ticket, steps=2)
    finally:
        module.wait_at_least = original
    expected = []
    for step in (3, 4):
        for _, _, _, _, _, w0, w1 in tasks:
            expected += [(c, step * per_step + base) for c, base, per_step in waits[w0:w1]]
    assert seen == expected
    assert counters.tolist() == [32, 42, 52]  # each task released its own counter once a step
    assert ticket.tolist() == [5 * N] and state.tolist() == [5, 0]


@triton.jit
def _probe(tile, ntiles, out_ptr, x_ptr, w_ptr, n, m, k, eps, g, PHASE: tl.constexpr, BLOCK: tl.constexpr):
    base = out_ptr + tile * 10
    tl.store(base + 0, tile.to(tl.float32))
    tl.store(base + 1, ntiles.to(tl.float32))
    tl.store(base + 2, tl.load(x_ptr))
    tl.store(base + 3, tl.load(w_ptr))
    tl.store(base + 4, n.to(tl.float32))
    tl.store(base + 5, m.to(tl.float32))
    tl.store(base + 6, k.to(tl.float32))
    tl.store(base + 7, eps)
    tl.store(base + 8, g)
    tl.store(base + 9, PHASE * 100 + BLOCK)


def _class(phase: int, block: int, out_slot: int, k: int, g: float, k_type: str = "tl.int32") -> TaskClass:
    return TaskClass(
        _probe,
        [
            Param("out_ptr", "ptr", dtype="tl.float32", slot=out_slot),
            Param("x_ptr", "ptr", dtype="tl.float32", slot=2 - out_slot),
            Param("w_ptr", "wptr", dtype="tl.float32", slot=1),
            Param("n", "int", dtype="tl.int32", slot=2),
            Param("m", "int", dtype="tl.int64", slot=0),
            Param("k", "int", value=k, dtype=k_type, uniform=True),
            Param("eps", "float", slot=1),
            Param("g", "float", value=g, uniform=True),
            Param("PHASE", "const", value=phase),
            Param("BLOCK", "const", value=block),
        ],
        f"probe/phase{phase}",
        phase=phase,
        num_tiles=True,
    )


def test_each_class_reads_its_instance_row_of_every_table():
    """Two classes of one body (phases 1 and 2), two instances, tables wider than the slots used
    (MAX_P 3, MAX_W 2, MAX_S 4): each task's body gets its tile and tile count, the pointer, weight pointer,
    integer and float of its own instance's row at the class's slots, the uniform scalars (one needing 64
    bits) and constexprs as written. Catches a wrong table stride or slot, a class dispatched to another's
    branch, a wrong PHASE, a uniform integer narrowed to 32 bits."""
    classes = [_class(1, 4, 0, 9, 0.25), _class(2, 8, 2, -(2**40), 1.5, "tl.int64")]
    text = source.megakernel_source(classes, 3, 2, 4)
    module = source.load_source("gaps_probe", text)
    outs = [torch.zeros(30) for _ in range(2)]
    xs = [torch.tensor([7.0]), torch.tensor([70.0])]
    ws = [torch.tensor([3.0]), torch.tensor([30.0])]
    filler = torch.zeros(1)
    # instance i: ptrs [out_i, filler, x_i] (class 1 swaps out and x slots), wptrs [filler, w_i]
    ptrs = torch.tensor(
        [
            [outs[0].data_ptr(), filler.data_ptr(), xs[0].data_ptr()],
            [xs[1].data_ptr(), filler.data_ptr(), outs[1].data_ptr()],
        ],
        dtype=torch.int64,
    )
    wptrs = torch.tensor([[filler.data_ptr(), ws[0].data_ptr()], [filler.data_ptr(), ws[1].data_ptr()]])
    ints = torch.tensor([[2**33 + 3 * 1024, 0, 11, 0], [6, 0, -12, 0]], dtype=torch.int64)
    floats = torch.tensor([[0.0, 0.5, 0.0, 0.0], [0.0, -2.5, 0.0, 0.0]], dtype=torch.float32)
    tasks = [[0, 0, 1, 3, 0, 0, 0], [1, 1, 2, 5, 1, 0, 0]]  # class 0 instance 0 tile 1; class 1 instance 1 tile 2
    counters = torch.zeros(2, dtype=torch.int64)
    state, ticket = torch.zeros(2, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    _launch(module, tasks, [[0, 0, 0]], counters, state, ticket, ptrs, wptrs, ints, floats)
    assert outs[0][10:20].tolist() == [1, 3, 7, 3, 11, 2**33 + 3 * 1024, 9, 0.5, 0.25, 104]
    assert outs[1][20:30].tolist() == [2, 5, 70, 30, -12, 6, -(2**40), -2.5, 1.5, 208]
    assert not outs[0][:10].any() and not outs[0][20:].any() and not outs[1][:20].any()
    assert counters.tolist() == [1, 1]
