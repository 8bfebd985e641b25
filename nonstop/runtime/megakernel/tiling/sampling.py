"""Tilings of the ops a megakernel step ends with: device sampling (``nonstop/kernels/sample.py``) and
``advance`` (``megakernel/advance.py``: the next step's inputs).

sample   scan: tile r·NC + c = chunk c of row r (CHUNK logits) -> cell c of row r of the ``sample.partial``
         workspace (statistics, best index, listed candidates and best scorers: 4 + KC + SC columns); verify:
         tile r·NC + c reads the row's cells (its best scorers), its chunk and the scorers' logits -> cell c of
         row r of ``sample.verify`` (4·SC); pick: tile r reads its row's cells of both (and the whole logits
         row, for the one-program search) -> next_ids[r] and the row's ``sample.path``
advance  one tile per sequence b: ids of its rows <- next_ids, token_log[b], start[b] += T, the sampler's
         noise counters of its rows += T
"""

from __future__ import annotations

from nonstop.program.ir import SuperOp
from nonstop.runtime.megakernel.tasks import Access, StageSpec, TileSpec
from nonstop.runtime.megakernel.tiling.context import TileContext

READ, WRITE = Access.READ, Access.WRITE


def sample(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    logits, out = ctx.buf(op.reads[0]), ctx.buf(op.writes[0])
    params = [ctx.buf(n) for n in op.reads[1:]]
    NC, CHUNK, width, vwidth = args["NC"], args["CHUNK"], 4 + args["KC"] + args["SC"], 4 * args["SC"]
    V = ctx.cols(logits)
    cells = ctx.scratch("sample.partial", ctx.R, NC * width)
    checks = ctx.scratch("sample.verify", ctx.R, NC * vwidth)
    paths = ctx.scratch("sample.path", ctx.R, 1)
    scan, verify, pick = [], [], []
    for r in range(ctx.R):
        row = (r, r + 1)
        mine = [ctx.box(p, READ, row) for p in params]
        for c in range(NC):
            chunk = ctx.box(logits, READ, row, (c * CHUNK, min((c + 1) * CHUNK, V)))
            regs = (chunk, *mine, ctx.box(cells, WRITE, row, (c * width, (c + 1) * width)))
            scan.append(TileSpec(r * NC + c, regs, (), f"row {r} chunk {c}"))
            regs = (chunk, ctx.box(logits, READ, row), ctx.box(cells, READ, row), *mine)
            regs += (ctx.box(checks, WRITE, row, (c * vwidth, (c + 1) * vwidth)),)
            verify.append(TileSpec(r * NC + c, regs, (), f"row {r} chunk {c}"))
        regs = (ctx.box(logits, READ, row), ctx.box(cells, READ, row), ctx.box(checks, READ, row), *mine)
        pick.append(TileSpec(r, (*regs, ctx.box(out, WRITE, row), ctx.box(paths, WRITE, row)), (), f"row {r}"))
    return [StageSpec("scan", scan), StageSpec("verify", verify), StageSpec("pick", pick)]


def advance(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    next_ids, ids, log, offset = (ctx.buf(n) for n in ("next_ids", "ids", "token_log", "sample_offset"))
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
            ctx.box(offset, READ, rows),
            ctx.box(offset, WRITE, rows),
        )
        tiles.append(TileSpec(b, regs, (), f"seq {b}"))
    return [StageSpec("main", tiles)]
