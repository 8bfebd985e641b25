"""Tilings of the MoE kinds (matching ``nonstop/kernels/moe.py``).

moe_front    router tiles (block_n experts of fp32 logits), latent (or copy) tiles that also zero their
             columns of moe_out, shared tiles (gate rows j and up rows S + j -> act[:, j]).
moe_experts  tile (slot, chunk) = slot * chunks + chunk: the slot-th distinct selected expert (chosen at
             run time), intermediate rows of the chunk, for every row that chose it; it ACCUMULATEs into
             all of moe_out (split-K fp32 atomics), so its tiles need no order among themselves.
             Slots: min(E, R * top_k); surplus slots exit.
moe_tail     block_n output columns of the residual target.
"""

from __future__ import annotations

from nonstop.program.ir import SuperOp
from nonstop.runtime.megakernel.regions import Access
from nonstop.runtime.megakernel.schedule import StageSpec, TileSpec
from nonstop.runtime.megakernel.tilectx import TileContext, chunks
from nonstop.runtime.megakernel.tiles_dense import target_regions

READ, WRITE, ACC = Access.READ, Access.WRITE, Access.ACCUMULATE


def moe_front(ctx: TileContext, op: SuperOp) -> list[StageSpec]:
    src = ctx.buf(op.reads[0])
    logits, moe_in, moe_out = ctx.buf("moe_logits"), ctx.buf("moe_in"), ctx.buf("moe_out")
    bn = ctx.config.block(op.kind)
    norm = ctx.weight(op, "norm")
    tiles = []

    def add(regs, weights, label):
        tiles.append(TileSpec(len(tiles), (ctx.box(src, READ), *regs), ctx.weights(*weights, norm), label))

    for a, b in chunks(op.weights["router"].shape[0], bn):
        add([ctx.box(logits, WRITE, cols=(a, b))], [ctx.weight(op, "router", 0, a, b)], f"router {a}:{b}")
    for a, b in chunks(ctx.cols(moe_in), bn):
        add([ctx.box(moe_in, WRITE, cols=(a, b)), ctx.box(moe_out, WRITE, cols=(a, b))], [ctx.weight(op, "latent_down", 0, a, b)], f"latent {a}:{b}")
    if "shared_gate_up" in op.weights:
        S = op.attrs["shared_width"]
        act = ctx.buf("moe_shared_act")
        for a, b in chunks(S, bn):
            add([ctx.box(act, WRITE, cols=(a, b))], [ctx.weight(op, "shared_gate_up", 0, a, b), ctx.weight(op, "shared_gate_up", 0, S + a, S + b)], f"shared {a}:{b}")
    return [StageSpec("main", tiles)]


def _expert_slices(ctx: TileContext, op: SuperOp, lo: int, hi: int, inter: int) -> list:
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


def moe_experts(ctx: TileContext, op: SuperOp) -> list[StageSpec]:
    mc = op.attrs["moe"]
    logits, moe_in, moe_out = ctx.buf(op.reads[0]), ctx.buf(op.reads[1]), ctx.buf(op.writes[0])
    parts = chunks(mc.intermediate_size, ctx.config.block(op.kind))
    regs = (ctx.box(logits, READ), ctx.box(moe_in, READ), ctx.box(moe_out, ACC))
    tiles = []
    for slot in range(min(mc.num_experts, ctx.R * mc.top_k)):
        for j, (a, b) in enumerate(parts):
            w = ctx.weights(ctx.weight(op, "bias"), *_expert_slices(ctx, op, a, b, mc.intermediate_size))
            tiles.append(TileSpec(slot * len(parts) + j, regs, w, f"slot {slot} inter {a}:{b}"))
    return [StageSpec("main", tiles)]


def moe_tail(ctx: TileContext, op: SuperOp) -> list[StageSpec]:
    reads = [ctx.box(ctx.buf("moe_out"), READ)]
    if "moe_shared_act" in op.reads:
        reads.append(ctx.box(ctx.buf("moe_shared_act"), READ))
    d = ctx.cfg.hidden_size
    tiles = []
    for j, (a, b) in enumerate(chunks(d, ctx.config.block(op.kind))):
        w = ctx.weights(ctx.weight(op, "latent_up", 0, a, b), ctx.weight(op, "latent_norm"), ctx.weight(op, "shared_down", 0, a, b))
        tiles.append(TileSpec(j, (*reads, *target_regions(ctx, op, (a, b))), w, f"cols {a}:{b}"))
    return [StageSpec("main", tiles)]
