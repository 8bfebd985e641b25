"""Tilings of the MoE kinds (``nonstop/kernels/moe.py``), from each launch's arguments.

moe_front    router tiles (BLOCK_NR experts of fp32 logits), latent (or copy) tiles that also zero their
             columns of moe_out, shared tiles (gate rows j and up rows S + j -> act[:, j]).
moe_experts  gate_up: program p of P routes, then takes the items t = p, p + P, .. (t = slot·chunks + chunk,
             the slot-th distinct selected expert, known at run time), writing act[slot rows, chunk] of
             the ``moe_experts.act`` workspace (row r of slot s at (s·R + r)·I); program 0 also writes
             ``moe_experts.route`` (per slot: the expert and every row's weight). Declared: every item the
             program may get. down: BLOCK_NO columns of moe_out from every slot's act and route.
moe_tail     BLOCK_N output columns of the residual target.
"""

from __future__ import annotations

from nonstop.program.ir import SuperOp
from nonstop.runtime.megakernel.tasks import Access, StageSpec, TileSpec
from nonstop.runtime.megakernel.tiling.context import TileContext, chunks
from nonstop.runtime.megakernel.tiling.dense import target_regions

READ, WRITE = Access.READ, Access.WRITE


def moe_front(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
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


def expert_slices(ctx: TileContext, op: SuperOp, lo: int, hi: int, inter: int) -> list:
    """One routed expert's share of intermediate rows [lo, hi): rows of w1 / w3 (dim 1), columns of w2
    (dim 2, in the tensor's own units: packed MXFP4 bytes hold 2 values, a scale covers 32)."""
    out = []
    for role, t in op.weights.items():
        if role == "bias":
            continue
        if role.startswith("w2"):
            per = t.shape[2]
            out.append(ctx.weight(op, role, 2, lo * per // inter, -(-hi * per // inter), dynamic=True))
        else:
            out.append(ctx.weight(op, role, 1, lo, hi, dynamic=True))
    return out


def moe_experts(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    logits, moe_in, moe_out = ctx.buf(op.reads[0]), ctx.buf(op.reads[1]), ctx.buf(op.writes[0])
    R, I, slots, P, n_chunks, BI = ctx.R, args["I"], args["slots"], args["n_gate_up"], args["n_chunks"], args["BLOCK_I"]
    act = ctx.scratch("moe_experts.act", 1, slots * R * I)
    route = ctx.scratch("moe_experts.route", slots, 1 + R)
    first = ctx.weights(ctx.weight(op, "bias"), *expert_slices(ctx, op, 0, min(I, BI), I))
    gate_up = []
    for p in range(P):
        regs = [ctx.box(logits, READ), ctx.box(moe_in, READ)]
        for t in range(p, slots * n_chunks, P):
            s, j = divmod(t, n_chunks)
            a, b = j * BI, min((j + 1) * BI, I)
            regs += [ctx.box(act, WRITE, (0, 1), ((s * R + r) * I + a, (s * R + r) * I + b)) for r in range(R)]
        if p == 0:
            regs.append(ctx.box(route, WRITE, (0, slots), (0, 1 + R)))
        gate_up.append(TileSpec(p, tuple(regs), first, f"program {p}/{P}"))
    reads = (ctx.box(act, READ, (0, 1), (0, slots * R * I)), ctx.box(route, READ, (0, slots), (0, 1 + R)))
    down = [
        TileSpec(j, (*reads, ctx.box(moe_out, WRITE, cols=(a, b))), (), f"cols {a}:{b}")
        for j, (a, b) in enumerate(chunks(args["K"], args["BLOCK_NO"]))
    ]
    return [StageSpec("gate_up", gate_up), StageSpec("down", down)]


def moe_tail(ctx: TileContext, op: SuperOp, args: dict) -> list[StageSpec]:
    reads = [ctx.box(ctx.buf("moe_out"), READ)]
    if "moe_shared_act" in op.reads:
        reads.append(ctx.box(ctx.buf("moe_shared_act"), READ))
    tiles = []
    for j, (a, b) in enumerate(chunks(args["D"], args["BLOCK_N"])):
        w = ctx.weights(
            ctx.weight(op, "latent_up", 0, a, b), ctx.weight(op, "latent_norm"), ctx.weight(op, "shared_down", 0, a, b)
        )
        tiles.append(TileSpec(j, (*reads, *target_regions(ctx, op, (a, b))), w, f"cols {a}:{b}"))
    return [StageSpec("main", tiles)]
