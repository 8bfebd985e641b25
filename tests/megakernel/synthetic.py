"""Random synthetic op graphs over small buffers, for testing the protocol apart from any model.

Ops come in a few shapes that cover every access kind: column-tiled GEMV-like ops (optionally
read-modify-write), zero-then-accumulate (split-K), row-wise ops, cache appends and attention-like
reads of the current and previous steps' cache rows.
"""

from __future__ import annotations

import random

from nonstop.runtime.megakernel.tasks import Access, BufferInfo, OpTiles, Region, StageSpec, TileSpec
from nonstop.runtime.megakernel.tiling.waits import assemble

R, W, A, P = Access.READ, Access.WRITE, Access.ACCUMULATE, Access.READ_PAST


def random_buffers(rng: random.Random, n: int = 4) -> list[BufferInfo]:
    bufs = [BufferInfo(f"b{i}", rng.randint(1, 3), rng.randint(3, 9)) for i in range(n)]
    rows = max(b.rows for b in bufs)
    bufs.append(BufferInfo("cache", rows, rng.randint(3, 6), kind="cache", append_only=True))
    return bufs


def _box(rng: random.Random, bufs, b: int, access: Access) -> Region:
    info = bufs[b]
    r0 = rng.randrange(info.rows)
    c0 = rng.randrange(info.cols)
    return Region(b, r0, rng.randint(r0 + 1, info.rows), c0, rng.randint(c0 + 1, info.cols), access)


def _whole(bufs, b: int, access: Access) -> Region:
    return Region(b, 0, bufs[b].rows, 0, bufs[b].cols, access)


def _chunks(n: int, k: int) -> list[tuple[int, int]]:
    k = max(1, min(k, n))
    edges = [round(i * n / k) for i in range(k + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if a < b]


def random_op(rng: random.Random, bufs, name: str) -> OpTiles:
    plain = [i for i, b in enumerate(bufs) if not b.append_only]
    cache = next(i for i, b in enumerate(bufs) if b.append_only)
    out = rng.choice(plain)
    src = rng.choice([b for b in plain if b != out] or plain)
    shape = rng.choice(["gemv", "gemv_rmw", "accumulate", "rows", "append", "attend"])
    info = bufs[out]
    if shape in ("gemv", "gemv_rmw"):
        tiles = []
        for t, (c0, c1) in enumerate(_chunks(info.cols, rng.randint(1, 4))):
            regs = [_whole(bufs, src, R), Region(out, 0, info.rows, c0, c1, W)]
            if shape == "gemv_rmw":
                regs.append(Region(out, 0, info.rows, c0, c1, R))
            tiles.append(TileSpec(t, tuple(regs)))
        return OpTiles(name, shape, None, [StageSpec("main", tiles)])
    if shape == "accumulate":
        zero = StageSpec("zero", [TileSpec(0, (_whole(bufs, out, W),))])
        adds = StageSpec(
            "add", [TileSpec(t, (_box(rng, bufs, src, R), _whole(bufs, out, A))) for t in range(rng.randint(1, 4))]
        )
        return OpTiles(name, shape, None, [zero, adds])
    rows = min(info.rows, bufs[src].rows, bufs[cache].rows)
    if shape == "rows":
        tiles = [
            TileSpec(r, (Region(src, r, r + 1, 0, bufs[src].cols, R), Region(out, r, r + 1, 0, info.cols, W)))
            for r in range(rows)
        ]
        return OpTiles(name, shape, None, [StageSpec("main", tiles)])
    if shape == "append":
        tiles = [
            TileSpec(r, (Region(src, r, r + 1, 0, bufs[src].cols, R), Region(cache, r, r + 1, 0, bufs[cache].cols, W)))
            for r in range(rows)
        ]
        return OpTiles(name, shape, None, [StageSpec("main", tiles)])
    tiles = [
        TileSpec(
            r,
            (
                Region(cache, r, r + 1, 0, bufs[cache].cols, R),
                Region(cache, r, r + 1, 0, bufs[cache].cols, P),
                Region(out, r, r + 1, 0, info.cols, W),
            ),
        )
        for r in range(rows)
    ]
    return OpTiles(name, shape, None, [StageSpec("main", tiles)])


def random_schedule(seed: int, n_ops: int = 8, persistent: bool = True):
    rng = random.Random(seed)
    bufs = random_buffers(rng)
    ops = [random_op(rng, bufs, f"op{i}") for i in range(n_ops)]
    return assemble(bufs, ops, persistent)
