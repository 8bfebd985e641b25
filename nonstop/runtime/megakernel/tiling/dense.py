"""Tilings of the dense kinds (``nonstop/kernels/dense.py``, ``gemv.py``), from each launch's arguments.

embed                     one tile per row
attnres_mix_norm          dots, mix, norm: a tile per (row, column chunk) in each
linear_residual, lm_head  BLOCK_N output columns for all rows (each tile recomputes the row's norm);
                          a residual target updated in place (``accumulate``) is a READ + WRITE of the
                          tile's own columns
mlp                       gate_up: BLOCK_I intermediate columns into the ``mlp.h`` workspace (row r at
                          r·I); down: BLOCK_N output columns from all of h
"""

from __future__ import annotations

from nonstop.program.ir import SuperOp
from nonstop.runtime.megakernel.tasks import Access, StageSpec, TileSpec, WeightSlice
from nonstop.runtime.megakernel.tiling.context import TileContext, chunks

READ, WRITE = Access.READ, Access.WRITE


def target_regions(ctx: TileContext, op: SuperOp, cols: tuple[int, int]) -> list:
    """The residual target's columns: written, or read and written when the op accumulates."""
    t = ctx.buf(op.writes[0])
    regs = [ctx.box(t, WRITE, cols=cols)]
    if op.attrs.get("accumulate", False):
        regs.append(ctx.box(t, READ, cols=cols))
    return regs


def row_major(ctx: TileContext, b: int, access: Access, width: int, cols: tuple[int, int]) -> list:
    """Columns ``cols`` of every row of a flat workspace holding R rows of ``width`` (row r at r·width)."""
    a, c = cols
    if a == 0 and c == width:
        return [ctx.box(b, access, (0, 1), (0, ctx.R * width))]
    return [ctx.box(b, access, (0, 1), (r * width + a, r * width + c)) for r in range(ctx.R)]


def embed(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    """Tile r: row r's embedding row (which one depends on the token id: a dynamic weight slice)."""
    ids, out = ctx.buf("ids"), ctx.buf(op.writes[0])
    w = op.weights["embed"]
    row = WeightSlice("embed", 0, 0, 1, w.shape[1] * w.element_size(), dynamic=True)
    tiles = [
        TileSpec(r, (ctx.box(ids, READ, (r, r + 1)), ctx.box(out, WRITE, (r, r + 1))), (row,), f"row {r}")
        for r in range(ctx.R)
    ]
    return [StageSpec("main", tiles)]


def attnres_mix_norm(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    """Three stages of R·NCH tiles, tile r·NCH + c = columns c·BLOCK_C.. of row r (``kernels/attnres.py``):
    dots (the chunk of every source -> the row's cells of ``attnres.dots``; the block store's chunk), mix (all
    the row's cells and the chunk of every source -> x's chunk and the chunk's cell of ``attnres.sq``), norm
    (the row's ``attnres.sq`` and x's chunk -> x's chunk)."""
    d = ctx.cfg.hidden_size
    n, store = op.attrs["n_blocks"], op.attrs.get("store_block")
    NCH, BC, width = args["NCH"], args["BLOCK_C"], 2 * args["BLOCK_S"]
    blocks, partial, x = ctx.buf("blocks"), ctx.buf("partial"), ctx.buf(op.writes[0])
    dots, sq = ctx.scratch("attnres.dots", ctx.R, NCH * width), ctx.scratch("attnres.sq", ctx.R, NCH)
    stages = {"dots": [], "mix": [], "norm": []}
    for r in range(ctx.R):
        row = (r, r + 1)
        for c, (a, b) in enumerate(chunks(d, BC)):
            t, name = r * NCH + c, f"row {r} cols {a}:{b}"
            sources = [ctx.box(partial, READ, row, (a, b))] + [
                ctx.box(blocks, READ, row, (s * d + a, s * d + b)) for s in range(n)
            ]
            regs = [*sources, ctx.box(dots, WRITE, row, (c * width, (c + 1) * width))]
            if store is not None:
                regs.append(ctx.box(blocks, WRITE, row, (store * d + a, store * d + b)))
            stages["dots"].append(TileSpec(t, tuple(regs), ctx.weights(ctx.weight(op, "query", 0, a, b)), name))
            regs = [
                *sources,
                ctx.box(dots, READ, row),
                ctx.box(x, WRITE, row, (a, b)),
                ctx.box(sq, WRITE, row, (c, c + 1)),
            ]
            stages["mix"].append(TileSpec(t, tuple(regs), (), name))
            regs = [ctx.box(sq, READ, row), ctx.box(x, READ, row, (a, b)), ctx.box(x, WRITE, row, (a, b))]
            stages["norm"].append(TileSpec(t, tuple(regs), ctx.weights(ctx.weight(op, "norm", 0, a, b)), name))
    return [StageSpec(name, tiles) for name, tiles in stages.items()]


def _gemv(ctx: TileContext, op: SuperOp, args: dict, norm: bool) -> list[StageSpec]:
    src = ctx.buf(op.reads[0])
    tiles = []
    for j, (a, b) in enumerate(chunks(args["N"], args["BLOCK_N"])):
        w = ctx.weights(
            ctx.weight(op, "w", 0, a, b), ctx.weight(op, "b", 0, a, b), ctx.weight(op, "norm") if norm else None
        )
        tiles.append(TileSpec(j, (ctx.box(src, READ), *target_regions(ctx, op, (a, b))), w, f"cols {a}:{b}"))
    return [StageSpec("main", tiles)]


def linear_residual(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    """Tile j: target[:, cols j] (+)= src W[cols j]ᵀ (+ b)."""
    return _gemv(ctx, op, args, norm=False)


def lm_head(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    """Tile j: logits[:, cols j] = RMSNorm(src) W[cols j]ᵀ (fp32)."""
    return _gemv(ctx, op, args, norm=True)


def mlp(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    src = ctx.buf(op.reads[0])
    I, D = args["I"], args["D"]
    h = ctx.scratch("mlp.h", 1, ctx.R * I)
    gate_up = []
    for j, (a, b) in enumerate(chunks(I, args["BLOCK_I"])):
        w = ctx.weights(
            *(ctx.weight(op, role, 0, a, b) for role in ("gate", "up", "gate_b", "up_b")), ctx.weight(op, "norm")
        )
        gate_up.append(TileSpec(j, (ctx.box(src, READ), *row_major(ctx, h, WRITE, I, (a, b))), w, f"inter {a}:{b}"))
    down = []
    for j, (a, b) in enumerate(chunks(D, args["BLOCK_N"])):
        w = ctx.weights(ctx.weight(op, "down", 0, a, b), ctx.weight(op, "down_b", 0, a, b))
        down.append(
            TileSpec(j, (*row_major(ctx, h, READ, I, (0, I)), *target_regions(ctx, op, (a, b))), w, f"cols {a}:{b}")
        )
    return [StageSpec("gate_up", gate_up), StageSpec("down", down)]
