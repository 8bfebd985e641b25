"""The schedule the megakernel runs: tilings that match the recorded kernel launches tile for tile.

``kernel_schedule(program, ops, plan, B, T)`` tiles every op with the block sizes its launcher chose
(``TilingConfig`` per op: ``BLOCK_N`` of the GEMV kinds, the split length / query block of MLA
attention) through the shared tilings (``tiling.TILINGS``), and with the tilings below where a kernel
splits its work differently from the shared table:

  mlp          gate_up: BLOCK_I intermediate columns per tile; down: BLOCK_N output columns
  gqa_qkv_rope tile j·PB + pb: BLOCK_P RoPE pairs (both channels of each) of packed q/k/v head j
  gqa_attn     split: tile ((b·HKV + g)·MB + mb)·NS + s (split 0 writes the output itself when the
               sequence fits one split); combine: tile (b·HKV + g)·MB + mb merges the others
  moe_front    router tiles of BLOCK_NR experts, then latent / shared tiles of BLOCK_N
  moe_experts  gate_up: P persistent programs, each routes, then strides over (slot, chunk) items,
               writing act[slot rows, chunk] of the scratch (program 0 also the slots' experts and row
               weights); down: BLOCK_NO columns of moe_out from every slot, in slot order
  sample       one tile per row: next_ids[r] from logits[r]
  advance      one tile per sequence: the next step's ids and start (``advance.py``)

Each op's stages must have exactly the kernel's tile counts (``ScheduleError`` otherwise), so the
validator proves the schedule that the kernel executes.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from nonstop.runtime.megakernel import advance
from nonstop.runtime.megakernel.regions import Access
from nonstop.runtime.megakernel.schedule import BufferInfo, OpTiles, ScheduleError, StageSpec, TileSpec, assemble
from nonstop.runtime.megakernel.tilectx import TileContext, TilingConfig, chunks
from nonstop.runtime.megakernel.tiles_dense import target_regions
from nonstop.runtime.megakernel.tiles_moe import _expert_slices
from nonstop.runtime.megakernel.tiling import TILINGS

READ, WRITE, ACC, PAST = Access.READ, Access.WRITE, Access.ACCUMULATE, Access.READ_PAST


def mlp(ctx: TileContext, op, args: dict) -> list[StageSpec]:
    src = ctx.buf(op.reads[0])
    I, D = args["I"], args["D"]
    act = ctx.scratch("mlp_h", I)  # the kernels' one h workspace, shared by every MLP
    gate_up = [
        TileSpec(
            j,
            (ctx.box(src, READ), ctx.box(act, WRITE, cols=(a, b))),
            ctx.weights(ctx.weight(op, "gate", 0, a, b), ctx.weight(op, "up", 0, a, b), ctx.weight(op, "norm")),
            f"inter {a}:{b}",
        )
        for j, (a, b) in enumerate(chunks(I, args["BLOCK_I"]))
    ]
    down = [
        TileSpec(
            j,
            (ctx.box(act, READ), *target_regions(ctx, op, (a, b))),
            ctx.weights(ctx.weight(op, "down", 0, a, b)),
            f"cols {a}:{b}",
        )
        for j, (a, b) in enumerate(chunks(D, args["BLOCK_N"]))
    ]
    return [StageSpec("gate_up", gate_up), StageSpec("down", down)]


def gqa_qkv_rope(ctx: TileContext, op, args: dict) -> list[StageSpec]:
    """Tile j·PB + pb: RoPE pairs [pb·BLOCK_P, +BLOCK_P) of packed head j (q heads, then k, then v heads),
    PB = cdiv(D/2, BLOCK_P): channels c and c + D/2 (rotate-half) or 2c, 2c + 1 (interleaved)."""
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
                ctx.weight(op, "norm"),
                ctx.weight(op, "inv_freq"),
            )
            tiles.append(TileSpec(j * PB + pb, tuple(regs), w, f"{label} pairs {p0}:{p1}"))
    return [StageSpec("main", tiles)]


def gqa_attn(ctx: TileContext, op, args: dict) -> list[StageSpec]:
    a = op.attrs
    H, HKV, D, layer = a["heads"], a["kv_heads"], a["head_dim"], a["cache_layer"]
    G, T, NS, MB, BM = H // HKV, ctx.T, args["NS"], args["MB"], args["BLOCK_M"]
    q, out = ctx.buf(op.reads[0]), ctx.buf(op.writes[0])
    k, v = ctx.cache(layer, "k", HKV * D), ctx.cache(layer, "v", HKV * D)
    cells = ctx.scratch("gqa_partial", NS * H)  # one abstract cell per (split, head) of a row
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
                            ctx.box(cells, WRITE, (r, r + 1), (s * H + h0, s * H + h1)),
                        ]
                        if s == 0:  # a sequence that fits one split is written here, not merged
                            regs.append(ctx.box(out, WRITE, (r, r + 1), (h0 * D, h1 * D)))
                    split.append(TileSpec(group * NS + s, tuple(regs), (), f"b{b} g{g} mb{mb} s{s}"))
                regs = []
                for r, h0, h1 in per_row:
                    regs += [ctx.box(cells, READ, (r, r + 1), (s * H + h0, s * H + h1)) for s in range(NS)]
                    regs.append(ctx.box(out, WRITE, (r, r + 1), (h0 * D, h1 * D)))
                combine.append(TileSpec(group, tuple(regs), (), f"b{b} g{g} mb{mb}"))
    return [StageSpec("split", split), StageSpec("combine", combine)]


def moe_front(ctx: TileContext, op, args: dict) -> list[StageSpec]:
    src = ctx.buf(op.reads[0])
    logits, moe_in, moe_out = ctx.buf("moe_logits"), ctx.buf("moe_in"), ctx.buf("moe_out")
    norm = ctx.weight(op, "norm")
    tiles = []

    def tile(regs, weights, label):
        tiles.append(TileSpec(len(tiles), (ctx.box(src, READ), *regs), ctx.weights(*weights, norm), label))

    for a, b in chunks(args["E"], args["BLOCK_NR"]):
        tile([ctx.box(logits, WRITE, cols=(a, b))], [ctx.weight(op, "router", 0, a, b)], f"router {a}:{b}")
    for a, b in chunks(args["W"], args["BLOCK_N"]):
        tile(
            [ctx.box(moe_in, WRITE, cols=(a, b)), ctx.box(moe_out, WRITE, cols=(a, b))],
            [ctx.weight(op, "latent_down", 0, a, b)],
            f"latent {a}:{b}",
        )
    if args["HAS_SHARED"]:
        S = args["S"]
        act = ctx.buf("moe_shared_act")
        for a, b in chunks(S, args["BLOCK_N"]):
            tile(
                [ctx.box(act, WRITE, cols=(a, b))],
                [ctx.weight(op, "shared_gate_up", 0, a, b), ctx.weight(op, "shared_gate_up", 0, S + a, S + b)],
                f"shared {a}:{b}",
            )
    return [StageSpec("main", tiles)]


def moe_experts(ctx: TileContext, op, args: dict) -> list[StageSpec]:
    logits, moe_in, moe_out = ctx.buf(op.reads[0]), ctx.buf(op.reads[1]), ctx.buf(op.writes[0])
    R, I, slots, P, n_chunks = ctx.R, args["I"], args["slots"], args["n_gate_up"], args["n_chunks"]
    act = ctx._add(BufferInfo("moe_experts.act", slots * R, I, "scratch"))
    route = ctx._add(BufferInfo("moe_experts.route", slots, 2, "scratch"))  # (expert, row weights) per slot
    first = ctx.weights(ctx.weight(op, "bias"), *_expert_slices(ctx, op, 0, min(I, args["BLOCK_I"]), I))
    gate_up = []
    for p in range(P):
        regs = [ctx.box(logits, READ), ctx.box(moe_in, READ)]
        for t in range(p, slots * n_chunks, P):  # the items this program may get (slots past the distinct ones exit)
            s, j = divmod(t, n_chunks)
            regs.append(
                ctx.box(act, WRITE, (s * R, (s + 1) * R), (j * args["BLOCK_I"], min((j + 1) * args["BLOCK_I"], I)))
            )
        if p == 0:
            regs.append(ctx.box(route, WRITE))
        gate_up.append(TileSpec(p, tuple(regs), first, f"program {p}/{P}"))
    down = [
        TileSpec(
            j, (ctx.box(act, READ), ctx.box(route, READ), ctx.box(moe_out, WRITE, cols=(a, b))), (), f"cols {a}:{b}"
        )
        for j, (a, b) in enumerate(chunks(args["K"], args["BLOCK_NO"]))
    ]
    return [StageSpec("gate_up", gate_up), StageSpec("down", down)]


def sample(ctx: TileContext, op, args: dict) -> list[StageSpec]:
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


OWN = {
    "mlp": mlp,
    "gqa_qkv_rope": gqa_qkv_rope,
    "gqa_attn": gqa_attn,
    "moe_front": moe_front,
    "moe_experts": moe_experts,
    "sample": sample,
    "advance": advance.tiling,
}


def op_config(base: TilingConfig, kind: str, args: dict) -> TilingConfig:
    """The shared tilings' config with this launch's block sizes."""
    config = base
    if "BLOCK_N" in args:
        config = replace(config, blocks=((kind, int(args["BLOCK_N"])),))
    if kind == "mla_attn":
        config = replace(
            config,
            attn_split=int(args["SPLIT"]),
            max_context=int(args["SPLIT"]) * int(args["NS"]),
            attn_block_m=int(args["BLOCK_M"]),
        )
    return config


def tile_op(ctx: TileContext, op, runs: list, launches: list) -> list[StageSpec]:
    """Stages of ``op`` matching its kernel's stages ``runs`` (plan.StageRun) tile for tile."""
    if len(launches) != 1:
        raise ScheduleError(f"{op.name}: {len(launches)} launches; the megakernel schedule needs one launch per op")
    args = launches[0].args
    base = ctx.config
    if op.kind in OWN:
        stages = OWN[op.kind](ctx, op, args)
    else:
        ctx.config = op_config(base, op.kind, args)
        try:
            stages = TILINGS[op.kind](ctx, op)
        finally:
            ctx.config = base
    got = [(s.name, len(s.tiles)) for s in stages]
    want = [(r.name, r.ntiles) for r in runs]
    if got != want:
        raise ScheduleError(f"{op.name}: schedule tiles {got} do not match the kernel's stages {want}")
    return stages


def reads_tensor(launches: list, tensor) -> bool:
    """Does any of ``launches`` take ``tensor`` (by address) as an argument?"""
    return any(
        isinstance(v, torch.Tensor) and v.data_ptr() == tensor.data_ptr()
        for launch in launches
        for v in launch.args.values()
    )


def declare_start_reads(ctx: TileContext, stages: list[StageSpec]) -> list[StageSpec]:
    """Add a READ of every sequence's ``start`` to each tile (the shared tilings leave the step's start
    positions implicit; ``advance`` writes them, so the validator must see who reads them)."""
    start = ctx._add(BufferInfo("start", ctx.B, 1, "state"))
    box = ctx.box(start, READ)
    return [StageSpec(s.name, [replace(t, regions=(*t.regions, box)) for t in s.tiles]) for s in stages]


def kernel_schedule(
    program,
    ops: list,
    launches: list[list],
    plan,
    B: int,
    T: int,
    start=None,
    persistent: bool = False,
    split_counters: bool = True,
):
    """(Schedule, opcode, instance and tile count per task): the tasks of ``ops`` (the program's ops
    plus appended ones such as ``sample``) in op / stage / tile order, counters and waits derived from
    their regions. A task's opcode is the plan's task class of its (op, stage). ``start``: the step's
    start tensor; ops whose launches take it read the ``start`` buffer. ``persistent``: steps run back
    to back in one launch (waits on the previous step's counters too)."""
    ctx = TileContext(program, B, T, TilingConfig())
    tiled = []
    for i, (op, runs, ls) in enumerate(zip(ops, plan.stages, launches)):
        stages = tile_op(ctx, op, runs, ls)
        if start is not None and op.kind != "advance" and reads_tensor(ls, start):
            stages = declare_start_reads(ctx, stages)
        tiled.append(OpTiles(op.name, op.kind, i, stages))
    schedule = assemble(ctx.buffers, tiled, persistent, B, T, None, split_counters)
    codes = [plan.stages[t.op][t.stage].opcode for t in schedule.tasks]
    instances = [plan.stages[t.op][t.stage].instance for t in schedule.tasks]
    ntiles = [plan.stages[t.op][t.stage].ntiles for t in schedule.tasks]
    return schedule, codes, instances, ntiles
