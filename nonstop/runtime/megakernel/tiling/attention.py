"""Tilings of the attention kinds (``nonstop/kernels/gqa.py``, ``mla.py``, ``kda.py``), from each launch's
arguments.

GQA   qkv_rope: tile j·PB + pb = RoPE pairs [pb·BLOCK_P, +BLOCK_P) of packed head j (q heads, then k, then v
      heads; PB = cdiv(D/2, BLOCK_P)), both channels of each pair; k and v tiles append to the cache.
      attn split: tile ((b·HKV + g)·MB + mb)·NS + s = the query items of block mb of KV group g of
      sequence b over keys of split s, writing partial cells (m, l, Σ p·v) of the ``gqa_attn.partial``
      workspace (cell (s, h) of a row at columns (s·H + h)·(D + 2)); split 0 also writes the output of a
      sequence whose keys fit one split. combine: tile (b·HKV + g)·MB + mb merges the cells of its items.
MLA   in_proj: BLOCK_N rows of the packed [q_in | kv | g] (a tile may straddle two outputs).
      q_up: tile h < N = head h (q_lat[h], q_pe[h]); tile N = the cache append of [norm(c_kv) | k_pe].
      attn split: tile (b·NS + s)·MB + mb = query items m = t·N + h of block mb of sequence b over keys of
      split s, writing cells of ``mla_attn.partial`` (cell (s, h) of a row at columns (s·N + h)·(L + 2));
      combine: tile h merges head h's cells of every row, applies W_UV[h] and the gate.
KDA   in_proj: BLOCK_N rows of the packed [q | k | v | g | b | f_a]; q/k/v columns also move their
      channels' conv windows in every sequence. core: tile b·H + h updates sequence b's head-h state.
"""

from __future__ import annotations

from nonstop.program.ir import SuperOp
from nonstop.runtime.megakernel.tasks import Access, StageSpec, TileSpec
from nonstop.runtime.megakernel.tiling.context import TileContext, chunks, packed_parts

READ, WRITE, PAST = Access.READ, Access.WRITE, Access.READ_PAST


# ----------------------------------------------------------------------------- GQA


def gqa_qkv_rope(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    a = op.attrs
    H, HKV, D, layer, BP = a["heads"], a["kv_heads"], a["head_dim"], a["cache_layer"], args["BLOCK_P"]
    half = D // 2
    PB = -(-half // BP)
    src, q = ctx.buf(op.reads[0]), ctx.buf(op.writes[0])
    k, v = ctx.cache(layer, "k", HKV * D), ctx.cache(layer, "v", HKV * D)
    tiles = []
    for j in range(H + 2 * HKV):
        if j < H:
            out, base, label = q, j * D, f"q{j}"
        else:
            g = (j - H) % HKV
            out, base, label = (k if j < H + HKV else v), g * D, f"{'kv'[j >= H + HKV]}{g}"
        for pb in range(PB):
            p0, p1 = pb * BP, min((pb + 1) * BP, half)
            spans = [(2 * p0, 2 * p1)] if a["interleaved"] else [(p0, p1), (half + p0, half + p1)]
            regs = [ctx.box(src, READ)] + [ctx.box(out, WRITE, cols=(base + c0, base + c1)) for c0, c1 in spans]
            w = ctx.weights(
                *(ctx.weight(op, "w_qkv", 0, j * D + c0, j * D + c1) for c0, c1 in spans),
                *(ctx.weight(op, "b_qkv", 0, j * D + c0, j * D + c1) for c0, c1 in spans),
                ctx.weight(op, "norm"),
                ctx.weight(op, "inv_freq"),
            )
            tiles.append(TileSpec(j * PB + pb, tuple(regs), w, f"{label} pairs {p0}:{p1}"))
    return [StageSpec("main", tiles)]


def gqa_attn(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    a = op.attrs
    H, HKV, D, layer = a["heads"], a["kv_heads"], a["head_dim"], a["cache_layer"]
    G, T, NS, MB, BM = H // HKV, ctx.T, args["NS"], args["MB"], args["BLOCK_M"]
    cell = D + 2
    q, out = ctx.buf(op.reads[0]), ctx.buf(op.writes[0])
    k, v = ctx.cache(layer, "k", HKV * D), ctx.cache(layer, "v", HKV * D)
    partial = ctx.scratch("gqa_attn.partial", ctx.R, NS * H * cell)
    split, combine = [], []
    for b in range(ctx.B):
        rows = ctx.seq_rows(b)
        for g in range(HKV):
            for mb in range(MB):
                m0, m1 = mb * BM, min((mb + 1) * BM, T * G)
                per_row = []  # (row, first head, end head) of the block's query items
                for t in range(T):
                    h0, h1 = max(m0 - t * G, 0), min(m1 - t * G, G)
                    if h0 < h1:
                        per_row.append((rows[0] + t, g * G + h0, g * G + h1))
                group = (b * HKV + g) * MB + mb
                kv = [ctx.box(c, acc, rows, (g * D, (g + 1) * D)) for c in (k, v) for acc in (READ, PAST)]
                for s in range(NS):
                    regs = list(kv)
                    for r, h0, h1 in per_row:
                        regs += [
                            ctx.box(q, READ, (r, r + 1), (h0 * D, h1 * D)),
                            ctx.box(partial, WRITE, (r, r + 1), ((s * H + h0) * cell, (s * H + h1) * cell)),
                        ]
                        if s == 0:  # a sequence that fits one split is written here, not merged
                            regs.append(ctx.box(out, WRITE, (r, r + 1), (h0 * D, h1 * D)))
                    split.append(TileSpec(group * NS + s, tuple(regs), (), f"b{b} g{g} mb{mb} s{s}"))
                regs = []
                for r, h0, h1 in per_row:
                    regs += [
                        ctx.box(partial, READ, (r, r + 1), ((s * H + h0) * cell, (s * H + h1) * cell))
                        for s in range(NS)
                    ]
                    regs.append(ctx.box(out, WRITE, (r, r + 1), (h0 * D, h1 * D)))
                combine.append(TileSpec(group, tuple(regs), (), f"b{b} g{g} mb{mb}"))
    return [StageSpec("split", split), StageSpec("combine", combine)]


# ----------------------------------------------------------------------------- MLA


def packed_gemv(
    ctx: TileContext, op: SuperOp, block_n: int, sizes: list[int], outputs: list[int], extra=None
) -> list[TileSpec]:
    """block_n rows of a packed weight ``w_in`` whose outputs go to buffers ``outputs`` (sizes ``sizes``);
    ``extra(part, lo, hi)`` adds regions for a part's columns."""
    src = ctx.buf(op.reads[0])
    tiles = []
    for j, (lo, hi) in enumerate(chunks(sum(sizes), block_n)):
        regs = [ctx.box(src, READ)]
        for part, a, b in packed_parts(sizes, lo, hi):
            regs.append(ctx.box(outputs[part], WRITE, cols=(a, b)))
            if extra:
                regs += extra(part, a, b)
        w = [ctx.weight(op, "w_in", 0, lo, hi), ctx.weight(op, "norm")]
        if "conv" in op.weights and lo < 3 * op.attrs.get("channels", 0):
            w.append(ctx.weight(op, "conv", 0, lo, min(hi, 3 * op.attrs["channels"])))
        tiles.append(TileSpec(j, tuple(regs), ctx.weights(*w), f"rows {lo}:{hi}"))
    return tiles


def mla_in_proj(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    outputs = [ctx.buf(n) for n in op.writes]
    return [StageSpec("main", packed_gemv(ctx, op, args["BLOCK_N"], op.attrs["in_sizes"], outputs))]


def mla_q_up(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    a = op.attrs
    N, P, Rr, L, layer = a["heads"], a["nope"], a["rope"], a["kv_lora"], a["cache_layer"]
    q_in, kv = ctx.buf(op.reads[0]), ctx.buf(op.reads[1])
    q_lat, q_pe = ctx.buf(op.writes[0]), ctx.buf(op.writes[1])
    latent = ctx.cache(layer, "latent", L + Rr)
    lora = "q_b" in op.weights
    tiles = []
    for h in range(N):
        head_in = None if lora else (h * (P + Rr), (h + 1) * (P + Rr))
        regs = [ctx.box(q_in, READ, cols=head_in), ctx.box(q_lat, WRITE, cols=(h * L, (h + 1) * L))]
        if Rr:
            regs.append(ctx.box(q_pe, WRITE, cols=(h * Rr, (h + 1) * Rr)))
        w = ctx.weights(
            ctx.weight(op, "q_norm"),
            ctx.weight(op, "q_b", 0, h * (P + Rr), (h + 1) * (P + Rr)),
            ctx.weight(op, "w_uk", 0, h, h + 1),
            ctx.weight(op, "inv_freq"),
        )
        tiles.append(TileSpec(h, tuple(regs), w, f"head {h}"))
    append = (ctx.box(kv, READ), ctx.box(latent, WRITE))
    tiles.append(
        TileSpec(N, append, ctx.weights(ctx.weight(op, "kv_norm"), ctx.weight(op, "inv_freq")), "cache append")
    )
    return [StageSpec("main", tiles)]


def mla_attn(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    a = op.attrs
    N, Rr, L, V, layer = a["heads"], a["rope"], a["kv_lora"], a["v_dim"], a["cache_layer"]
    NS, BM, MB, T = args["NS"], args["BLOCK_M"], args["MB"], ctx.T
    cell = L + 2
    q_lat, q_pe, out = ctx.buf(op.reads[0]), ctx.buf(op.reads[1]), ctx.buf(op.writes[0])
    latent = ctx.cache(layer, "latent", L + Rr)
    partial = ctx.scratch("mla_attn.partial", ctx.R, NS * N * cell)
    split = []
    for b in range(ctx.B):
        rows = ctx.seq_rows(b)
        for s in range(NS):
            for mb in range(MB):
                m0, m1 = mb * BM, min((mb + 1) * BM, T * N)
                regs = [ctx.box(latent, READ, rows), ctx.box(latent, PAST, rows)]
                for t in range(T):
                    h0, h1 = max(m0 - t * N, 0), min(m1 - t * N, N)
                    if h0 >= h1:
                        continue
                    r = (rows[0] + t, rows[0] + t + 1)
                    regs += [
                        ctx.box(q_lat, READ, r, (h0 * L, h1 * L)),
                        ctx.box(partial, WRITE, r, ((s * N + h0) * cell, (s * N + h1) * cell)),
                    ]
                    if Rr:
                        regs.append(ctx.box(q_pe, READ, r, (h0 * Rr, h1 * Rr)))
                split.append(TileSpec((b * NS + s) * MB + mb, tuple(regs), (), f"b{b} items {m0}:{m1} split {s}"))
    combine = []
    for h in range(N):
        regs = [ctx.box(partial, READ, cols=((s * N + h) * cell, (s * N + h + 1) * cell)) for s in range(NS)]
        regs.append(ctx.box(out, WRITE, cols=(h * V, (h + 1) * V)))
        if a["gated"]:
            regs.append(ctx.box(ctx.buf(op.reads[2]), READ, cols=(h * V, (h + 1) * V)))
        combine.append(TileSpec(h, tuple(regs), ctx.weights(ctx.weight(op, "w_uv", 0, h, h + 1)), f"head {h}"))
    return [StageSpec("split", split), StageSpec("combine", combine)]


# ----------------------------------------------------------------------------- KDA


def kda_in_proj(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    a = op.attrs
    C, K, layer = a["channels"], a["conv_size"], a["cache_layer"]
    outputs = [ctx.buf(n) for n in op.writes]
    conv = ctx.state(layer, "conv", 3 * C * (K - 1))

    def windows(part: int, lo: int, hi: int) -> list:
        if part >= 3:
            return []
        cols = ((part * C + lo) * (K - 1), (part * C + hi) * (K - 1))
        return [ctx.box(conv, READ, cols=cols), ctx.box(conv, WRITE, cols=cols)]

    return [StageSpec("main", packed_gemv(ctx, op, args["BLOCK_N"], a["in_sizes"], outputs, windows))]


def kda_core(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    a = op.attrs
    H, D, layer = a["heads"], a["head_dim"], a["cache_layer"]
    q, k, v, og, beta, fa = (ctx.buf(n) for n in op.reads)
    out = ctx.buf(op.writes[0])
    state = ctx.state(layer, "recurrent", H * D * D)
    low_rank_gate = "g_b" in op.weights
    tiles = []
    for b in range(ctx.B):
        rows = ctx.seq_rows(b)
        for h in range(H):
            head = (h * D, (h + 1) * D)
            regs = [ctx.box(x, READ, rows, head) for x in (q, k, v)]
            regs += [
                ctx.box(og, READ, rows, None if low_rank_gate else head),
                ctx.box(beta, READ, rows, (h, h + 1)),
                ctx.box(fa, READ, rows),
            ]
            regs += [
                ctx.box(state, READ, (b, b + 1), (h * D * D, (h + 1) * D * D)),
                ctx.box(state, WRITE, (b, b + 1), (h * D * D, (h + 1) * D * D)),
            ]
            regs.append(ctx.box(out, WRITE, rows, head))
            w = ctx.weights(
                ctx.weight(op, "f_b", 0, *head),
                ctx.weight(op, "g_b", 0, *head),
                ctx.weight(op, "A_log", 0, h, h + 1),
                ctx.weight(op, "dt_bias", 0, *head),
                ctx.weight(op, "o_norm"),
            )
            tiles.append(TileSpec(b * H + h, tuple(regs), w, f"b{b} h{h}"))
    return [StageSpec("main", tiles)]
