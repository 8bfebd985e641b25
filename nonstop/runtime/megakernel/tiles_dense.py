"""Tilings of the row-wise and GEMV super-op kinds: embed, attnres_mix_norm, linear_residual, lm_head,
mlp, and the schedule's own ``sample_greedy`` (next step's token ids, for persistent runs).

GEMV tiles own ``block_n`` output columns for all R rows and read their whole input (an RMSNorm of
the row is recomputed per tile rather than waited for). A residual target updated in place
(``accumulate``) is a READ + WRITE of the tile's own columns.
"""

from __future__ import annotations

from nonstop.program.ir import SuperOp
from nonstop.runtime.megakernel.regions import Access
from nonstop.runtime.megakernel.schedule import StageSpec, TileSpec, WeightSlice
from nonstop.runtime.megakernel.tilectx import TileContext, chunks

READ, WRITE = Access.READ, Access.WRITE


def target_regions(ctx: TileContext, op: SuperOp, cols: tuple[int, int]) -> list:
    """The residual target's columns: written, or read and written when the op accumulates."""
    t = ctx.buf(op.writes[0])
    regs = [ctx.box(t, WRITE, cols=cols)]
    if op.attrs.get("accumulate", False):
        regs.append(ctx.box(t, READ, cols=cols))
    return regs


def embed(ctx: TileContext, op: SuperOp) -> list[StageSpec]:
    """Tile r: row r's embedding row (which one depends on the token id: a dynamic weight slice)."""
    ids, out = ctx.buf("ids"), ctx.buf(op.writes[0])
    w = op.weights["embed"]
    row = WeightSlice("embed", 0, 0, 1, w.shape[1] * w.element_size(), dynamic=True)
    tiles = [TileSpec(r, (ctx.box(ids, READ, (r, r + 1)), ctx.box(out, WRITE, (r, r + 1))), (row,), f"row {r}") for r in range(ctx.R)]
    return [StageSpec("main", tiles)]


def attnres_mix_norm(ctx: TileContext, op: SuperOp) -> list[StageSpec]:
    """Tile r: x[r] = RMSNorm(Mix(blocks[r, :n], partial[r])); blocks[r, store] = partial[r] if storing."""
    d = ctx.cfg.hidden_size
    n, store = op.attrs["n_blocks"], op.attrs.get("store_block")
    blocks, partial, x = ctx.buf("blocks"), ctx.buf("partial"), ctx.buf(op.writes[0])
    w = ctx.weights(ctx.weight(op, "query"), ctx.weight(op, "norm"))
    tiles = []
    for r in range(ctx.R):
        rows = (r, r + 1)
        regs = [ctx.box(partial, READ, rows), ctx.box(x, WRITE, rows)]
        if n:
            regs.append(ctx.box(blocks, READ, rows, (0, n * d)))
        if store is not None:
            regs.append(ctx.box(blocks, WRITE, rows, (store * d, (store + 1) * d)))
        tiles.append(TileSpec(r, tuple(regs), w, f"row {r}"))
    return [StageSpec("main", tiles)]


def linear_residual(ctx: TileContext, op: SuperOp) -> list[StageSpec]:
    """Tile j: target[:, cols j] (+)= src W[cols j]ᵀ (+ b)."""
    src = ctx.buf(op.reads[0])
    n = op.weights["w"].shape[0]
    tiles = []
    for j, (a, b) in enumerate(chunks(n, ctx.config.block(op.kind))):
        regs = [ctx.box(src, READ)] + target_regions(ctx, op, (a, b))
        tiles.append(TileSpec(j, tuple(regs), ctx.weights(ctx.weight(op, "w", 0, a, b), ctx.weight(op, "b", 0, a, b)), f"cols {a}:{b}"))
    return [StageSpec("main", tiles)]


def lm_head(ctx: TileContext, op: SuperOp) -> list[StageSpec]:
    """Tile j: logits[:, cols j] = RMSNorm(src) W[cols j]ᵀ (fp32)."""
    src, out = ctx.buf(op.reads[0]), ctx.buf(op.writes[0])
    n = op.weights["w"].shape[0]
    tiles = [TileSpec(j, (ctx.box(src, READ), ctx.box(out, WRITE, cols=(a, b))), ctx.weights(ctx.weight(op, "w", 0, a, b), ctx.weight(op, "norm")), f"cols {a}:{b}")
             for j, (a, b) in enumerate(chunks(n, ctx.config.block(op.kind)))]
    return [StageSpec("main", tiles)]


def mlp(ctx: TileContext, op: SuperOp) -> list[StageSpec]:
    """Stage gate_up, tile j: act[:, j] = glu(x̂ W_gate[j]ᵀ, x̂ W_up[j]ᵀ) into scratch ``mlp_act_{I}``;
    stage down, tile j: target[:, cols j] (+)= act W_down[cols j]ᵀ."""
    src = ctx.buf(op.reads[0])
    inter, d = op.weights["gate"].shape[0], op.weights["down"].shape[0]
    act = ctx.scratch(f"mlp_act_{inter}", inter)
    up = []
    for j, (a, b) in enumerate(chunks(inter, ctx.config.block(op.kind))):
        w = ctx.weights(*(ctx.weight(op, role, 0, a, b) for role in ("gate", "up", "gate_b", "up_b")), ctx.weight(op, "norm"))
        up.append(TileSpec(j, (ctx.box(src, READ), ctx.box(act, WRITE, cols=(a, b))), w, f"inter {a}:{b}"))
    down = []
    for j, (a, b) in enumerate(chunks(d, ctx.config.block(op.kind))):
        w = ctx.weights(ctx.weight(op, "down", 0, a, b), ctx.weight(op, "down_b", 0, a, b))
        down.append(TileSpec(j, (ctx.box(act, READ), *target_regions(ctx, op, (a, b))), w, f"cols {a}:{b}"))
    return [StageSpec("gate_up", up), StageSpec("down", down)]


def sample_greedy(ctx: TileContext) -> list[StageSpec]:
    """Tile r: ids[r] = argmax logits[r] — the next step's token, so steps can run back to back."""
    logits, ids = ctx.buf("logits"), ctx.buf("ids")
    return [StageSpec("main", [TileSpec(r, (ctx.box(logits, READ, (r, r + 1)), ctx.box(ids, WRITE, (r, r + 1))), (), f"row {r}") for r in range(ctx.R)])]
