"""Tilings of the ops a megakernel step ends with: device sampling (``nonstop/kernels/sample.py``) and
``advance`` (``megakernel/advance.py``: the next step's inputs).

sample   one tile per row: next_ids[r] from logits[r] and the row's sampling parameters
advance  one tile per sequence b: ids of its rows <- next_ids, token_log[b], start[b] += T
"""

from __future__ import annotations

from nonstop.program.ir import SuperOp
from nonstop.runtime.megakernel.tasks import Access, StageSpec, TileSpec
from nonstop.runtime.megakernel.tiling.context import TileContext

READ, WRITE = Access.READ, Access.WRITE


def sample(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    logits, out = ctx.buf(op.reads[0]), ctx.buf(op.writes[0])
    params = [ctx.buf(n) for n in op.reads[1:]]
    tiles = [
        TileSpec(
            r,
            (
                ctx.box(logits, READ, (r, r + 1)),
                *(ctx.box(p, READ, (r, r + 1)) for p in params),
                ctx.box(out, WRITE, (r, r + 1)),
            ),
            (),
            f"row {r}",
        )
        for r in range(ctx.R)
    ]
    return [StageSpec("main", tiles)]


def advance(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    next_ids, ids, log = ctx.buf("next_ids"), ctx.buf("ids"), ctx.buf("token_log")
    start = ctx.start()
    tiles = []
    for b in range(ctx.B):
        rows = ctx.seq_rows(b)
        regs = (
            ctx.box(next_ids, READ, rows),
            ctx.box(ids, WRITE, rows),
            ctx.box(start, READ, (b, b + 1)),
            ctx.box(start, WRITE, (b, b + 1)),
            ctx.box(log, WRITE, (b, b + 1)),
        )
        tiles.append(TileSpec(b, regs, (), f"seq {b}"))
    return [StageSpec("main", tiles)]
