"""Cost of each super-op per step: weight bytes streamed, bytes read / written, FLOPs, nominal tiles.

rows = R tokens in the step; context = tokens already cached per sequence (attention reads them);
sequences = B (rows = B·T; default: one token per sequence). KDA state and conv windows move once per
sequence, whatever T.
Routed experts stream only the distinct experts the rows select: min(E, rows·top_k) of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nonstop.program.ir import Cost, Program, SuperOp

TILE_N = 64  # nominal output rows per GEMV tile


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _expert_bytes(op: SuperOp, rows: int) -> tuple[int, int]:
    """(bytes, matmul elements) of the experts that ``rows`` rows can touch."""
    mc = op.attrs["moe"]
    experts = {n: t for n, t in op.weights.items() if n != "bias"}
    per_expert = sum(_nbytes(t) for t in experts.values()) // mc.num_experts
    # packed MXFP4 holds two weights per byte; its scales are not matmul elements
    elements = sum(2 * t.numel() if n.endswith("_packed") else t.numel() for n, t in experts.items() if not n.endswith("_scale")) // mc.num_experts
    distinct = min(mc.num_experts, rows * mc.top_k)
    return per_expert * distinct + _nbytes(op.weights["bias"]), elements * rows * mc.top_k


def make_cost(op: SuperOp, program: Program):
    buffers = program.buffers
    elt = {"model": program.dtype.itemsize, "float32": 4, "int64": 8}
    act_in = sum(buffers[b].row_numel * elt[buffers[b].dtype] for b in op.reads)
    act_out = sum(buffers[b].row_numel * elt[buffers[b].dtype] for b in op.writes)
    matmul = sum(t.numel() for n, t in op.weights.items() if t.dim() >= 2 and n not in ("embed", "conv"))
    cfg = program.cfg
    mdt = program.dtype.itemsize

    def cost(rows: int, context: int, sequences: int | None = None) -> Cost:
        seqs = rows if sequences is None else sequences
        weight = sum(_nbytes(t) for t in op.weights.values())
        flops = 2 * matmul * rows
        extra_read = extra_write = 0
        if op.kind == "embed":
            weight = rows * cfg.hidden_size * mdt
            flops = 0
        elif op.kind == "moe_experts":
            weight, elements = _expert_bytes(op, rows)
            flops = 2 * elements
        elif op.kind == "mla_attn":
            m = cfg.mla
            keys = context + 1
            extra_read = rows * keys * m.cache_dim * mdt
            flops += 2 * rows * keys * m.num_heads * (m.cache_dim + m.kv_lora_rank)
        elif op.kind == "gqa_attn":
            g = cfg.gqa
            keys = context + 1
            extra_read = rows * keys * 2 * g.num_kv_heads * g.head_dim * mdt
            flops += 4 * rows * keys * g.num_heads * g.head_dim
        elif op.kind in ("mla_q_up", "gqa_qkv_rope"):
            extra_write = rows * (cfg.mla.cache_dim if op.kind == "mla_q_up" else 2 * cfg.gqa.num_kv_heads * cfg.gqa.head_dim) * mdt
        elif op.kind == "kda_core":
            k = cfg.kda
            state = k.num_heads * k.head_dim * k.head_dim * 4
            extra_read, extra_write = seqs * state, seqs * state
            flops += 6 * rows * k.num_heads * k.head_dim * k.head_dim
        elif op.kind == "kda_in_proj":
            window = 3 * cfg.kda.proj_dim * (cfg.kda.conv_size - 1) * mdt
            extra_read, extra_write = seqs * window, seqs * window
        elif op.kind == "attnres_mix_norm":  # reads only the n_blocks live sources of "blocks"
            sources = op.attrs["n_blocks"] + 1
            read = weight + rows * sources * cfg.hidden_size * mdt
            stored = rows * cfg.hidden_size * mdt if op.attrs.get("store_block") is not None else 0
            return Cost(weight, read, rows * act_out + stored, 4 * rows * sources * cfg.hidden_size)
        return Cost(weight, weight + rows * act_in + extra_read, rows * act_out + extra_write, flops)

    return cost


def make_tiles(op: SuperOp, program: Program):
    cfg = program.cfg

    def tiles(rows: int, sequences: int | None = None) -> int:
        if op.kind == "kda_core":  # one tile per (sequence, head)
            return cfg.kda.num_heads * (rows if sequences is None else sequences)
        if op.kind in ("mla_attn", "gqa_attn"):
            heads = cfg.mla.num_heads if op.kind == "mla_attn" else cfg.gqa.num_kv_heads
            return heads * rows
        if op.kind == "moe_experts":
            mc = op.attrs["moe"]
            return min(mc.num_experts, rows * mc.top_k) * math.ceil(mc.intermediate_size / TILE_N)
        if op.kind in ("embed", "attnres_mix_norm"):
            return rows
        out = sum(t.shape[0] for n, t in op.weights.items() if t.dim() >= 2 and n not in ("embed", "conv"))
        return max(1, math.ceil(out / TILE_N))

    return tiles


def attach_costs(program: Program) -> None:
    for op in program.ops:
        op.cost = make_cost(op, program)
        op.tiles = make_tiles(op, program)


# ----------------------------------------------------------------------------- collectives (multi-rank programs)
# A multi-rank Program (``nonstop/dist``) holds collective super-ops: ``tp_all_reduce`` (sum a buffer over
# the attention group), ``vocab_gather`` (all-gather the LM head's vocabulary parts), ``embed_shard`` (the
# embedding rows of this rank's vocabulary part; an all-reduce follows) and ``moe_ep`` (routed experts
# over the expert group: split sizes, dispatch, the local experts, combine). Their traffic on the wire is
# counted per rank as bytes *sent* by that rank (ring algorithms for all-reduce / all-gather):
#   all-reduce of N bytes over n ranks: 2·(n-1)/n·N;  all-gather of n parts of P bytes: (n-1)·P;
#   gather to one rank: P from each other rank;
#   all-to-all: the rows sent to other ranks (pairs whose expert lives on the sender itself stay local).

COLLECTIVE_KINDS = ("tp_all_reduce", "vocab_gather", "embed_shard", "moe_ep")


@dataclass(frozen=True)
class Collective:
    """One collective a rank takes part in: ``kind`` all_reduce | all_gather | gather | all_to_all |
    broadcast | send, over ``group`` (tp | ep | world) of ``ranks`` ranks, ``count`` launches per step, sending
    ``wire_bytes`` bytes per step in all (expected value under uniform routing for all-to-alls)."""

    kind: str
    group: str
    ranks: int
    count: int
    wire_bytes: float
    purpose: str


def all_reduce_wire_bytes(nbytes: float, ranks: int) -> float:
    """Bytes one rank sends in a ring all-reduce of ``nbytes``."""
    return 2 * (ranks - 1) / ranks * nbytes


def all_gather_wire_bytes(part_bytes: float, ranks: int) -> float:
    """Bytes one rank sends in a ring all-gather of ``ranks`` parts of ``part_bytes``."""
    return (ranks - 1) * part_bytes


def owned_rows(rows: int, ranks: int, index: int) -> int:
    """Rows that attention-group rank ``index`` of ``ranks`` routes through the experts (contiguous
    parts, the first rows % ranks ranks one larger)."""
    base, extra = divmod(rows, ranks)
    return base + (1 if index < extra else 0)


def moe_ep_traffic(op: SuperOp, rows: int) -> dict:
    """Expected per-step facts of a ``moe_ep`` op on its rank at ``rows`` rows per attention group:
    sent / received (token, expert) pairs, the share of them that crosses the wire, experts touched."""
    a = op.attrs
    sent = owned_rows(rows, a["tp_ranks"], a["tp_rank"]) * a["top_k"]
    # the expert group's ranks route rows / tp_ranks rows each on average; a rank receives the pairs of its
    # share of the physical experts
    received = rows * a["ep_ranks"] / a["tp_ranks"] * a["top_k"] * a["local_experts"] / max(1, a["physical_experts"])
    remote = 1.0 - a["local_fraction"]
    return {"sent": sent, "received": received, "sent_remote": sent * remote, "received_remote": received * remote, "touched": min(a["local_experts"], math.ceil(received))}


def collective_op_cost(op: SuperOp, program: Program):
    """``cost(rows, context, sequences)`` of a collective super-op (its memory traffic and FLOPs; the wire
    bytes are in ``op_collectives``)."""
    buffers = program.buffers
    elt = {"model": program.dtype.itemsize, "float32": 4, "int64": 8}
    act_in = sum(buffers[b].row_numel * elt[buffers[b].dtype] for b in op.reads)
    act_out = sum(buffers[b].row_numel * elt[buffers[b].dtype] for b in op.writes)
    cfg = program.cfg

    def cost(rows: int, context: int, sequences: int | None = None) -> Cost:
        if op.kind == "embed_shard":
            weight = rows * cfg.hidden_size * program.dtype.itemsize // op.attrs["tp_ranks"]
            return Cost(weight, weight + rows * act_in, rows * act_out, 0)
        if op.kind == "moe_ep":
            t = moe_ep_traffic(op, rows)
            experts = {n: w for n, w in op.weights.items() if n != "bias"}
            n_local = max(1, op.attrs["local_experts"])
            per_expert = sum(_nbytes(w) for w in experts.values()) // n_local
            elements = sum(2 * w.numel() if n.endswith("_packed") else w.numel() for n, w in experts.items() if not n.endswith("_scale")) // n_local
            weight = per_expert * t["touched"] + _nbytes(op.weights["bias"])
            width_bytes = buffers["moe_in"].row_numel * program.dtype.itemsize
            payload = (t["sent"] + t["received"]) * width_bytes
            return Cost(weight, weight + rows * act_in + payload, rows * act_out + payload, int(2 * elements * t["received"]))
        return Cost(0, rows * act_in, rows * act_out, rows * buffers[op.reads[0]].row_numel if op.kind == "tp_all_reduce" else 0)

    return cost


def op_collectives(op: SuperOp, program: Program, rows: int) -> list[Collective]:
    """The collectives of one op for a step of ``rows`` rows per attention group ([] for other ops)."""
    a = op.attrs
    buffers = program.buffers
    if op.kind == "tp_all_reduce":
        spec = buffers[op.writes[0]]
        nbytes = rows * spec.row_numel * spec.torch_dtype(program.dtype).itemsize
        return [Collective("all_reduce", "tp", a["tp_ranks"], 1, all_reduce_wire_bytes(nbytes, a["tp_ranks"]), a.get("purpose", "partial sums"))]
    if op.kind == "vocab_gather":  # gathered on the attention group's first rank, which samples
        part = rows * buffers[op.reads[0]].row_numel * 4
        return [Collective("gather", "tp", a["tp_ranks"], 1, part if a["tp_rank"] else 0, "logits (vocabulary parts)")]
    if op.kind == "moe_ep" and a["ep_ranks"] > 1:
        t = moe_ep_traffic(op, rows)
        width_bytes = buffers["moe_in"].row_numel * program.dtype.itemsize
        chunks, E = a["chunks"], a["ep_ranks"]
        return [
            Collective("all_to_all", "ep", E, 1, (E - 1) * chunks * a["max_local"] * 4, "split sizes"),
            Collective("all_to_all", "ep", E, chunks, t["sent_remote"] * width_bytes, "dispatch (expert inputs)"),
            Collective("all_to_all", "ep", E, chunks, t["received_remote"] * width_bytes, "combine (expert outputs)"),
        ]
    return []


def collective_op_tiles(op: SuperOp, program: Program):
    """``tiles(rows, sequences)``: one per launch for a collective; the local experts' GEMV tiles for
    ``moe_ep`` (experts touched x intermediate tiles)."""

    def tiles(rows: int, sequences: int | None = None) -> int:
        if op.kind == "moe_ep":
            return max(1, moe_ep_traffic(op, rows)["touched"]) * math.ceil(op.attrs["moe"].intermediate_size / TILE_N)
        return 1

    return tiles
