"""``TileContext``'s buffer registry and weight slices at hand-checked shapes.

The buffer shapes are what the validator proves regions inside of and what the simulator allocates, and the
weight slices are what the schedule's statistics and the prefetch table are built from; each expected value
below is plain arithmetic on the tensors' shapes and element sizes (B = 2 sequences x T = 3 tokens)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from nonstop.program.ir import BufferSpec
from nonstop.runtime.megakernel.tasks import Access, WeightSlice
from nonstop.runtime.megakernel.tiling.context import TileContext


def _ctx(B: int = 2, T: int = 3) -> TileContext:
    program = SimpleNamespace(
        buffers={"h": BufferSpec("h", (6,), "float32"), "none": BufferSpec("none", (0,), "float32")},
        cfg=SimpleNamespace(hidden_size=6),
    )
    return TileContext(program, B, T)


def _shape(ctx: TileContext, b: int) -> tuple:
    info = ctx.buffers[b]
    return info.name, info.rows, info.cols, info.kind, info.append_only


def test_buffers_have_a_row_per_token_or_per_sequence():
    """Activations and cache appends: one row per token (B*T = 6); KDA state and the start positions: one
    row per sequence (B = 2). Catches state or ``start`` sized by tokens (boxes checked against the wrong
    bounds, a simulator buffer of the wrong shape) and an activation of no columns (an empty region)."""
    ctx = _ctx()
    assert _shape(ctx, ctx.buf("h")) == ("h", 6, 6, "activation", False)
    assert _shape(ctx, ctx.buf("none")) == ("none", 6, 1, "activation", False)
    assert _shape(ctx, ctx.cache(1, "k", 4)) == ("L1.k", 6, 4, "cache", True)
    assert _shape(ctx, ctx.state(1, "recurrent", 9)) == ("L1.recurrent", 2, 9, "state", False)
    assert _shape(ctx, ctx.start()) == ("start", 2, 1, "step", False)
    assert ctx.buf("h") == 0 and ctx.start() == 4 and len(ctx.buffers) == 5  # registered once by name
    assert ctx.seq_rows(1) == (3, 6)
    r = ctx.box(ctx.state(1, "recurrent", 9), Access.WRITE)
    assert (r.r0, r.r1, r.c0, r.c1) == (0, 2, 0, 9)


def test_a_grown_workspace_holds_every_use_in_both_dimensions():
    """A workspace used as [2, 8], then [1, 20] (larger: grows) must cover both uses' rows and columns:
    [2, 20]; [1, 10] then [3, 5] grows to [3, 10]. Catches growth that keeps only the new use's rows or
    columns (an earlier op's box then lies outside the buffer)."""
    ctx = _ctx()
    b = ctx.scratch("ws", 2, 8)
    assert ctx.scratch("ws", 1, 20) == b
    assert (ctx.buffers[b].rows, ctx.buffers[b].cols) == (2, 20)
    c = ctx.scratch("other", 1, 10)
    ctx.scratch("other", 3, 5)
    assert (ctx.buffers[c].rows, ctx.buffers[c].cols) == (3, 10)


def test_static_weight_slices_count_the_bytes_they_stream():
    """[10, 6] fp16 weight: whole = 120 bytes; rows 4:7 = 3 * 6 * 2 = 36; rows 8:99 are cut to 8:10 = 24;
    columns 2:5 = 10 * 3 * 2 = 60; a 0-d fp32 scalar is one element of 4 bytes; a missing role is None."""
    ctx = _ctx()
    op = SimpleNamespace(weights={"w": torch.zeros(10, 6, dtype=torch.float16), "s": torch.tensor(3.0)})
    assert ctx.weight(op, "w") == WeightSlice("w", -1, 0, 10, 120, False)
    assert ctx.weight(op, "w", 0, 4, 7) == WeightSlice("w", 0, 4, 7, 36, False)
    assert ctx.weight(op, "w", 0, 8, 99) == WeightSlice("w", 0, 8, 10, 24, False)
    assert ctx.weight(op, "w", 1, 2, 5) == WeightSlice("w", 1, 2, 5, 60, False)
    assert ctx.weight(op, "s") == WeightSlice("s", -1, 0, 1, 4, False)
    assert ctx.weight(op, "missing") is None
    assert ctx.weights(None, ctx.weight(op, "s"), None) == (WeightSlice("s", -1, 0, 1, 4, False),)


def test_a_dynamic_slice_lies_within_one_expert():
    """Stacked experts [4, 8, 5] bf16: rows 2:6 of the routed expert are 4 * 5 * 2 = 40 bytes along dim 1
    of the stack; the whole of one expert is 8 * 5 * 2 = 80 bytes. Catches slicing the stack itself (rows
    of the expert dimension, cut at 4 experts)."""
    ctx = _ctx()
    op = SimpleNamespace(weights={"e": torch.zeros(4, 8, 5, dtype=torch.bfloat16)})
    assert ctx.weight(op, "e", 1, 2, 6, dynamic=True) == WeightSlice("e", 1, 2, 6, 40, True)
    assert ctx.weight(op, "e", 1, 6, 20, dynamic=True) == WeightSlice("e", 1, 6, 8, 20, True)
    assert ctx.weight(op, "e", dynamic=True) == WeightSlice("e", -1, 0, 8, 80, True)
