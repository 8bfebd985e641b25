"""Gaps the mutation audit found in the megakernel's KDA tiling (``tiling/attention.py``): the boxes of a
speculative-verification shape (T > 1 rows a sequence) and of the low-rank output gate, derived by hand
from ``kda_core_tile``'s pointer arithmetic (no model, no kernel). An under-declared read lets the
schedule start the tile before the producer of those columns finished: a race sequential runs never show."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from nonstop.program.ir import BufferSpec, SuperOp
from nonstop.runtime.megakernel.tasks import Access
from nonstop.runtime.megakernel.tiling import attention
from nonstop.runtime.megakernel.tiling.context import TileContext

R_, W_ = Access.READ, Access.WRITE


def _context(B: int, T: int, widths: dict[str, int]) -> TileContext:
    program = SimpleNamespace(
        buffers={n: BufferSpec(n, (w,) if w > 1 else (), "float32") for n, w in widths.items()},
        cfg=SimpleNamespace(hidden_size=8),
    )
    return TileContext(program, B, T)


def _boxes(ctx: TileContext, tile) -> set[tuple]:
    return {(ctx.buffers[r.buffer].name, r.r0, r.r1, r.c0, r.c1, r.access) for r in tile.regions}


def test_kda_core_low_rank_gate_with_verification_rows():
    """Catches a kda_core tiling that declares only the head's columns of the low-rank gate input og (the
    tile multiplies the whole og row by W_gb[h]: all G = 3 columns) or a slice of f_a (the decay reads
    all RANK = 3 columns), or rows of one token instead of the sequence's T = 3 verification rows.
    H = 2 heads of D = 2, B = 2 sequences: tile 3 = sequence 1 (rows 3..5), head 1."""
    widths = {"kq": 4, "kk": 4, "kv": 4, "kg": 3, "kb": 2, "kf": 3, "ko": 4}
    ctx = _context(2, 3, widths)
    weights = {"g_b": torch.zeros(4, 3), "f_b": torch.zeros(4, 3)}
    op = SuperOp(
        "L0.kda_core",
        "kda_core",
        0,
        ("kq", "kk", "kv", "kg", "kb", "kf"),
        ("ko",),
        weights,
        dict(heads=2, head_dim=2, cache_layer=0),
    )
    (main,) = attention.kda_core(ctx, op, {})
    assert len(main.tiles) == 4
    assert _boxes(ctx, main.tiles[3]) == {
        ("kq", 3, 6, 2, 4, R_),
        ("kk", 3, 6, 2, 4, R_),
        ("kv", 3, 6, 2, 4, R_),
        ("kg", 3, 6, 0, 3, R_),
        ("kb", 3, 6, 1, 2, R_),
        ("kf", 3, 6, 0, 3, R_),
        ("L0.recurrent", 1, 2, 4, 8, R_),
        ("L0.recurrent", 1, 2, 4, 8, W_),
        ("ko", 3, 6, 2, 4, W_),
    }
