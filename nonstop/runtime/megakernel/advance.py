"""The ``advance`` op: the last task of a megakernel step prepares the next step's inputs on the device.

Per sequence b (tile b; rows b·T .. b·T + T - 1):
    ids[b·T + t] = next_ids[b·T + t]      (the tokens the step sampled; for T = 1 the next decode input)
    start[b]    += T                       (the next step's first position)
so consecutive decode steps of one shape need no host copies: the next launch embeds the sampled
tokens at the advanced positions (the host still reserves the cache pages and advances its own
lengths, ``ModelCache.batch`` / ``advance``). A host ``forward`` overwrites both with its arguments.

Ordering: ``ids`` is declared (the embedding tasks read it, so the schedule orders this write after
them); ``start`` is read by the attention / cache-append / KDA tasks without a declared region, which
are all ancestors of the logits that ``sample`` (this op's producer) reads.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nonstop.program.ir import SuperOp
from nonstop.runtime.megakernel.regions import Access
from nonstop.runtime.megakernel.schedule import BufferInfo, StageSpec, TileSpec


@triton.jit
def advance_tile(b, next_ids_ptr, ids_ptr, start_ptr, T, BLOCK_T: tl.constexpr):
    """ids[b·T + t] = next_ids[b·T + t] for t < T; start[b] += T."""
    t = tl.arange(0, BLOCK_T)
    rows = b * T + t
    tl.store(ids_ptr + rows, tl.load(next_ids_ptr + rows, mask=t < T), mask=t < T)
    tl.store(start_ptr + b, tl.load(start_ptr + b) + T)


@triton.jit
def _advance_kernel(next_ids_ptr, ids_ptr, start_ptr, T, BLOCK_T: tl.constexpr):
    advance_tile(tl.program_id(0), next_ids_ptr, ids_ptr, start_ptr, T, BLOCK_T)


def advance_op() -> SuperOp:
    return SuperOp("advance", "advance", None, ("next_ids",), ("ids",), {}, {})


def launch(op, env) -> None:
    T = env.T
    _advance_kernel[(env.B,)](env.buf["next_ids"], env.buf["ids"], env.batch.start, T, BLOCK_T=triton.next_power_of_2(T))


def tiling(ctx, op, args=None) -> list[StageSpec]:
    """Tile b: reads next_ids rows of b, writes ids rows of b and start[b]."""
    next_ids, ids = ctx.buf("next_ids"), ctx.buf("ids")
    start = ctx._add(BufferInfo("start", ctx.B, 1, "state"))
    tiles = []
    for b in range(ctx.B):
        rows = ctx.seq_rows(b)
        regs = (ctx.box(next_ids, Access.READ, rows), ctx.box(ids, Access.WRITE, rows), ctx.box(start, Access.READ, (b, b + 1)), ctx.box(start, Access.WRITE, (b, b + 1)))
        tiles.append(TileSpec(b, regs, (), f"seq {b}"))
    return [StageSpec("main", tiles)]
