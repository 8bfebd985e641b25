"""The cost model: what each super-op of a decode step moves and computes, and the tiles it splits into.

It is the one cost model of the project: ``nonstop program`` prints it per op; ``nonstop info``, the
benchmarks' bandwidth floors and the tuners read its totals through ``program/footprint.py``;
``tests/program/test_cost_model.py`` checks it against counts made without it (the tensors of built
models, checkpoints on disk, the caches' real buffers, the megakernel's tiling).

A step has ``rows`` = R tokens of ``sequences`` = B sequences (R = B·T; default B = R: one token each)
at ``context`` tokens already cached per sequence.

  weight_bytes   every tensor the op streams, once per step, except the embedding (min(R, V) rows of its table)
                 and routed experts (the min(E, R·top_k) distinct experts R rows can select).
  bytes_read     weights + activation rows read + cache / state reads: attention reads each sequence's
                 context + T keys once (its T rows share them: a tile holds (token, head) items of one
                 sequence), KDA its recurrent state and conv window once per sequence.
  bytes_written  activation rows written + cache appends (one entry per token) + KDA state writes.
  flops          2 · matmul weight elements · R, plus attention (per key) and the KDA state update.
  tiles          GEMVs: one tile per TILE_N output rows of each weight pass; attention: one per
                 (sequence, head) - MLA: (sequence, block of ATTN_BLOCK_M (token, head) items, split of
                 ATTN_SPLIT_KEYS keys) plus one combine tile per head; rows-wise ops: one per row.
                 These are units of work at fixed block sizes, a measure of an op's parallelism. The
                 megakernel's tiling (``runtime/megakernel/tiling``) takes each launch's own block sizes,
                 which split an op further to fill the target's SMs, so its task counts differ from these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nonstop.config import ModelConfig
from nonstop.program.ir import Cost, Program, SuperOp

TILE_N = 64  # GEMV output rows (moe_experts: intermediate rows) per tile
ATTN_SPLIT_KEYS = 256  # cached keys per split-KV tile of MLA attention
ATTN_BLOCK_M = 32  # (token, head) query items per MLA attention tile
KDA_STATE_BYTES = 4  # the KDA recurrent state is fp32 whatever the model dtype


# ----------------------------------------------------------------------------- caches and states


def cache_token_bytes(cfg: ModelConfig, kind: str, elt: int) -> int:
    """Bytes one token adds to the attention cache of a layer of ``kind`` (elt: the cache's element size)."""
    if kind == "mla":
        return cfg.mla.cache_dim * elt
    if kind == "gqa":
        return 2 * cfg.gqa.num_kv_heads * cfg.gqa.head_dim * elt
    return 0


def sequence_keys(rows: int, seqs: int, context: int) -> int:
    """Cached keys attention reads in a step: each of ``seqs`` sequences' ``context`` keys plus its new
    tokens' own (``rows`` in all), once per sequence = seqs·context + rows (rows·(context + 1) at one
    token a sequence)."""
    return seqs * context + rows


def attended_keys(rows: int, seqs: int, context: int) -> int:
    """(row, key) pairs attention scores in a step: row t (0-based) of a sequence sees its ``context`` cached
    keys and its first t + 1 new tokens, so a sequence of n rows scores n·(context + 1) + n(n-1)/2 pairs.
    The ``rows`` are split over ``seqs`` sequences as evenly as the step splits them (rows·(context + 1) at
    one token a sequence; also at ``seqs`` 0, the planner's probe of a row's own cost)."""
    if seqs < 1:
        return rows * (context + 1)
    each, extra = divmod(rows, seqs)
    causal = (seqs - extra) * each * (each - 1) // 2 + extra * (each + 1) * each // 2
    return rows * (context + 1) + causal


def kda_state_bytes(cfg: ModelConfig) -> int:
    """One KDA layer's recurrent state per sequence: [H, D, D] fp32."""
    k = cfg.kda
    return k.num_heads * k.head_dim * k.head_dim * KDA_STATE_BYTES


def kda_window_bytes(cfg: ModelConfig, elt: int) -> int:
    """One KDA layer's short-conv windows per sequence: [3, H·D, K-1] in the model dtype."""
    k = cfg.kda
    return 3 * k.proj_dim * (k.conv_size - 1) * elt


def cache_bytes_per_token(cfg: ModelConfig, elt: int) -> int:
    """Attention-cache bytes per token, all layers."""
    return sum(cache_token_bytes(cfg, kind, elt) for kind in cfg.attn_types)


def state_bytes_per_sequence(cfg: ModelConfig, elt: int) -> int:
    """KDA recurrent states + conv windows per sequence, all layers."""
    return cfg.num_kda_layers * (kda_state_bytes(cfg) + kda_window_bytes(cfg, elt)) if cfg.kda else 0


# ----------------------------------------------------------------------------- bytes and FLOPs


def _nbytes(t) -> int:
    """Bytes a weight streams: a tensor's; a packed weight's (the CPU executor's ``runtime/cpu/packed``) the
    tensors its kernel reads (``streamed``: row tiles and their padding, int8 scales); an int8 (Q, scales) pair's."""
    if isinstance(t, tuple):
        return sum(_nbytes(x) for x in t)
    streamed = getattr(t, "streamed", None)
    if streamed is not None:
        return sum(_nbytes(getattr(t, name)) for name in streamed)
    return t.numel() * t.element_size()


def weight_elements(role: str, t) -> int:
    """Weight values a tensor holds: packed MXFP4 bytes hold two, block scales none."""
    if role.endswith("_scale"):
        return 0
    return 2 * t.numel() if role.endswith("_packed") else t.numel()


def _expert_bytes(op: SuperOp, rows: int) -> tuple[int, int]:
    """(bytes, matmul elements) of the experts that ``rows`` rows can touch. A packed Program's experts stream
    the stacks the CPU executor gathers from (``op.attrs["dense_experts"]``: MXFP4 widened, bf16 / int8 copies)."""
    mc = op.attrs["moe"]
    experts = {n: t for n, t in op.weights.items() if n != "bias"}
    streamed = op.attrs.get("dense_experts") or experts
    per_expert = sum(_nbytes(t) for t in streamed.values()) // mc.num_experts
    elements = sum(weight_elements(n, t) for n, t in experts.items()) // mc.num_experts
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

    def cost(rows: int, context: int = 0, sequences: int | None = None) -> Cost:
        seqs = rows if sequences is None else sequences
        weight = sum(_nbytes(t) for t in op.weights.values())
        flops = 2 * matmul * rows
        extra_read = extra_write = 0
        if op.kind == "embed":
            table = op.weights["embed"]  # rows of it gathered: at most the whole table, however many rows
            weight = min(rows, table.shape[0]) * table.shape[1] * table.element_size()
            flops = 0
        elif op.kind == "moe_experts":
            weight, elements = _expert_bytes(op, rows)
            flops = 2 * elements
        elif op.kind == "mla_attn":
            m = cfg.mla
            extra_read = sequence_keys(rows, seqs, context) * cache_token_bytes(cfg, "mla", mdt)
            flops += 2 * attended_keys(rows, seqs, context) * m.num_heads * (m.cache_dim + m.kv_lora_rank)
        elif op.kind == "gqa_attn":
            g = cfg.gqa
            extra_read = sequence_keys(rows, seqs, context) * cache_token_bytes(cfg, "gqa", mdt)
            flops += 4 * attended_keys(rows, seqs, context) * g.num_heads * g.head_dim
        elif op.kind in ("mla_q_up", "gqa_qkv_rope"):
            extra_write = rows * cache_token_bytes(cfg, "mla" if op.kind == "mla_q_up" else "gqa", mdt)
        elif op.kind == "kda_core":
            k = cfg.kda
            extra_read = extra_write = seqs * kda_state_bytes(cfg)
            flops += 6 * rows * k.num_heads * k.head_dim * k.head_dim
        elif op.kind == "kda_in_proj":
            extra_read = extra_write = seqs * kda_window_bytes(cfg, mdt)
        elif op.kind == "attnres_mix_norm":  # reads only the n_blocks live sources of "blocks"
            sources = op.attrs["n_blocks"] + 1
            read = weight + rows * sources * cfg.hidden_size * mdt
            stored = rows * cfg.hidden_size * mdt if op.attrs.get("store_block") is not None else 0
            return Cost(weight, read, rows * act_out + stored, 4 * rows * sources * cfg.hidden_size)
        return Cost(weight, weight + rows * act_in + extra_read, rows * act_out + extra_write, flops)

    return cost


# ----------------------------------------------------------------------------- tiles


def _blocks(n: int) -> int:
    return math.ceil(n / TILE_N)


def _mla_attn_tiles(op: SuperOp, rows: int, seqs: int, context: int) -> int:
    """Split-KV tiles of a step: a sequence of n new tokens has ceil(n·heads / ATTN_BLOCK_M) query blocks,
    each over ceil((context + n) / ATTN_SPLIT_KEYS) key splits; plus one combine tile per head. The rows
    split over ``seqs`` sequences as evenly as the step splits them (``seqs`` 0: each row on its own)."""
    heads = op.attrs["heads"]
    seqs = seqs if seqs >= 1 else rows
    each, extra = divmod(rows, seqs)

    def one(tokens: int) -> int:
        return math.ceil(tokens * heads / ATTN_BLOCK_M) * math.ceil((context + tokens) / ATTN_SPLIT_KEYS)

    return (seqs - extra) * one(each) + extra * one(each + 1) + heads


def _moe_front_tiles(op: SuperOp, cfg: ModelConfig) -> int:
    mc = cfg.moe
    shared = _blocks(op.attrs["shared_width"]) if "shared_gate_up" in op.weights else 0
    return _blocks(mc.num_experts) + _blocks(mc.latent_size or cfg.hidden_size) + shared


# tiles(op, cfg, rows, sequences, context) per op kind
_TILES = {
    "embed": lambda op, cfg, r, b, c: r,
    "attnres_mix_norm": lambda op, cfg, r, b, c: r,
    "linear_residual": lambda op, cfg, r, b, c: _blocks(op.weights["w"].shape[0]),
    "lm_head": lambda op, cfg, r, b, c: _blocks(op.weights["w"].shape[0]),
    "mlp": lambda op, cfg, r, b, c: _blocks(op.weights["gate"].shape[0]) + _blocks(op.weights["down"].shape[0]),
    "gqa_qkv_rope": lambda op, cfg, r, b, c: op.attrs["heads"] + 2 * op.attrs["kv_heads"],
    "gqa_attn": lambda op, cfg, r, b, c: b * op.attrs["kv_heads"],
    "mla_in_proj": lambda op, cfg, r, b, c: _blocks(sum(op.attrs["in_sizes"])),
    "mla_q_up": lambda op, cfg, r, b, c: op.attrs["heads"] + 1,
    "mla_attn": lambda op, cfg, r, b, c: _mla_attn_tiles(op, r, b, c),
    "kda_in_proj": lambda op, cfg, r, b, c: _blocks(sum(op.attrs["in_sizes"])),
    "kda_core": lambda op, cfg, r, b, c: b * op.attrs["heads"],
    "moe_front": lambda op, cfg, r, b, c: _moe_front_tiles(op, cfg),
    "moe_experts": lambda op, cfg, r, b, c: (
        min(cfg.moe.num_experts, r * cfg.moe.top_k) * _blocks(cfg.moe.intermediate_size)
    ),
    "moe_tail": lambda op, cfg, r, b, c: _blocks(cfg.hidden_size),
}


def make_tiles(op: SuperOp, program: Program):
    rule = _TILES[op.kind]

    def tiles(rows: int, context: int = 0, sequences: int | None = None) -> int:
        return rule(op, program.cfg, rows, rows if sequences is None else sequences, context)

    return tiles


def attach_costs(program: Program) -> None:
    """Give every op of ``program`` its ``cost`` and ``tiles`` (collective super-ops of a multi-rank
    Program included)."""
    for op in program.ops:
        collective = op.kind in COLLECTIVE_KINDS
        op.cost = (collective_op_cost if collective else make_cost)(op, program)
        op.tiles = (collective_op_tiles if collective else make_tiles)(op, program)


# ----------------------------------------------------------------------------- collectives (multi-rank programs)
# A multi-rank Program (``nonstop/dist``) holds collective super-ops: ``tp_all_reduce`` (sum a buffer over
# the attention group), ``vocab_gather`` (all-gather the LM head's vocabulary parts), ``embed_shard`` (the
# embedding rows of this rank's vocabulary part; an all-reduce follows) and ``moe_ep`` (routed experts
# over the expert group: split sizes, dispatch, the local experts, combine). Their traffic on the wire is
# counted per rank as bytes *sent* by that rank (ring algorithms for all-reduce / all-gather):
#   all-reduce of N bytes over n ranks: 2·(n-1)/n·N;  all-gather of n parts of P bytes: (n-1)·P;
#   gather to one rank: P from each other rank;
#   all-to-all: the rows sent to other ranks (pairs whose expert lives on the sender itself stay local);
#               in the static exchange the whole fixed-capacity buffers for the other ranks.

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


# The MoE token exchange runs in one of two modes (``nonstop/dist/exchange.py`` chooses):
#   dynamic: split sizes first (int32 [chunks, local experts] per peer), then exactly the pairs whose
#            expert lives on another rank, one z row each way;
#   static:  every chunk, a fixed-capacity buffer per peer (``static_capacity`` rows of [int32 local expert
#            slot | z row], padding included) out, the same rows' outputs back; no size exchange.
EXCHANGE_MODES = ("dynamic", "static")
SLOT_ID_BYTES = 4  # the static exchange's per-row header: the local expert slot (int32; -1: empty)


def static_capacity(rows_routed: int, top_k: int, chunks: int, held: int) -> int:
    """Rows a rank that routes ``rows_routed`` rows reserves per chunk for a peer holding ``held`` distinct
    experts: the most (token, expert) pairs it can send there in one chunk. A chunk holds at most
    ceil(n·k / chunks) of the n·k pairs (cut in (row, j) order), and a row's k distinct experts put at most
    min(k, held) pairs on one rank."""
    return min(-(-rows_routed * top_k // chunks), rows_routed * min(top_k, held))


def routed_rows(group_rows: tuple[int, ...], tp: int, ep: int, rank: int) -> list[int]:
    """Rows each rank of ``rank``'s expert group routes in a step where attention group g has
    ``group_rows[g]`` rows (its tp ranks route contiguous parts: ``owned_rows``)."""
    first = rank // ep * ep
    return [owned_rows(group_rows[r // tp], tp, r % tp) for r in range(first, first + ep)]


def static_splits(op: SuperOp, group_rows: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """(send [E], recv [E]): rows per chunk ``op``'s rank sends to / receives from each rank of its expert
    group in the static exchange; every rank derives the same figures from the step's rows per attention
    group and the placement, so no size is exchanged or read from a device."""
    a = op.attrs
    E, me, k, C = a["ep_ranks"], a["ep_rank"], a["top_k"], a["chunks"]
    routed = routed_rows(group_rows, a["tp_ranks"], E, a["rank"])
    held = [len(set(s)) for s in a["placement"].slots]
    send = [static_capacity(routed[me], k, C, held[d]) for d in range(E)]
    recv = [static_capacity(routed[s], k, C, held[me]) for s in range(E)]
    return send, recv


def uniform_rows(op: SuperOp, rows: int) -> tuple[int, ...]:
    """Rows per attention group when each of the layout's groups has ``rows``."""
    return (rows,) * (op.attrs["world"] // op.attrs["tp_ranks"])


def moe_ep_traffic(op: SuperOp, rows: int) -> dict:
    """Expected per-step facts of a ``moe_ep`` op on its rank at ``rows`` rows per attention group:
    sent / received (token, expert) pairs, the share of them that crosses the wire, experts touched;
    ``exchange``: the mode the op's costs describe (``attrs["exchange"]``, default dynamic) and, for the
    static mode, the rows of the fixed-capacity buffers sent / received per step (all chunks)."""
    a = op.attrs
    sent = owned_rows(rows, a["tp_ranks"], a["tp_rank"]) * a["top_k"]
    # the expert group's ranks route rows / tp_ranks rows each on average; a rank receives the pairs of its
    # share of the physical experts
    received = rows * a["ep_ranks"] / a["tp_ranks"] * a["top_k"] * a["local_experts"] / max(1, a["physical_experts"])
    remote = 1.0 - a["local_fraction"]
    out = {
        "sent": sent,
        "received": received,
        "sent_remote": sent * remote,
        "received_remote": received * remote,
        "touched": min(a["local_experts"], math.ceil(received)),
        "exchange": a.get("exchange", "dynamic"),
    }
    if out["exchange"] == "static":
        send, recv = static_splits(op, uniform_rows(op, rows))
        me, C = a["ep_rank"], a["chunks"]
        out.update(
            buffer_sent=C * sum(send),
            buffer_received=C * sum(recv),
            buffer_sent_remote=C * (sum(send) - send[me]),
            buffer_received_remote=C * (sum(recv) - recv[me]),
        )
    return out


def collective_op_cost(op: SuperOp, program: Program):
    """``cost(rows, context, sequences)`` of a collective super-op (its memory traffic and FLOPs; the wire
    bytes are in ``op_collectives``)."""
    buffers = program.buffers
    elt = {"model": program.dtype.itemsize, "float32": 4, "int64": 8}
    act_in = sum(buffers[b].row_numel * elt[buffers[b].dtype] for b in op.reads)
    act_out = sum(buffers[b].row_numel * elt[buffers[b].dtype] for b in op.writes)
    cfg = program.cfg

    def cost(rows: int, context: int = 0, sequences: int | None = None) -> Cost:
        if op.kind == "embed_shard":
            weight = rows * cfg.hidden_size * program.dtype.itemsize // op.attrs["tp_ranks"]
            return Cost(weight, weight + rows * act_in, rows * act_out, 0)
        if op.kind == "moe_ep":
            t = moe_ep_traffic(op, rows)
            experts = {n: w for n, w in op.weights.items() if n != "bias"}
            n_local = max(1, op.attrs["local_experts"])
            per_expert = sum(_nbytes(w) for w in experts.values()) // n_local
            elements = (
                sum(
                    2 * w.numel() if n.endswith("_packed") else w.numel()
                    for n, w in experts.items()
                    if not n.endswith("_scale")
                )
                // n_local
            )
            weight = per_expert * t["touched"] + _nbytes(op.weights["bias"])
            width_bytes = buffers["moe_in"].row_numel * program.dtype.itemsize
            if t["exchange"] == "static":  # the whole buffers are written, sent and read back, padding included
                payload = (t["buffer_sent"] + t["buffer_received"]) * (2 * width_bytes + SLOT_ID_BYTES)
            else:
                payload = (t["sent"] + t["received"]) * width_bytes
            return Cost(
                weight, weight + rows * act_in + payload, rows * act_out + payload, int(2 * elements * t["received"])
            )
        return Cost(
            0, rows * act_in, rows * act_out, rows * buffers[op.reads[0]].row_numel if op.kind == "tp_all_reduce" else 0
        )

    return cost


def op_collectives(op: SuperOp, program: Program, rows: int) -> list[Collective]:
    """The collectives of one op for a step of ``rows`` rows per attention group ([] for other ops)."""
    a = op.attrs
    buffers = program.buffers
    if op.kind == "tp_all_reduce":
        spec = buffers[op.writes[0]]
        nbytes = rows * spec.row_numel * spec.torch_dtype(program.dtype).itemsize
        return [
            Collective(
                "all_reduce",
                "tp",
                a["tp_ranks"],
                1,
                all_reduce_wire_bytes(nbytes, a["tp_ranks"]),
                a.get("purpose", "partial sums"),
            )
        ]
    if op.kind == "vocab_gather":  # gathered on the attention group's first rank, which samples
        part = rows * buffers[op.reads[0]].row_numel * 4
        return [Collective("gather", "tp", a["tp_ranks"], 1, part if a["tp_rank"] else 0, "logits (vocabulary parts)")]
    if op.kind == "moe_ep" and a["ep_ranks"] > 1:
        t = moe_ep_traffic(op, rows)
        width_bytes = buffers["moe_in"].row_numel * program.dtype.itemsize
        chunks, E = a["chunks"], a["ep_ranks"]
        if t["exchange"] == "static":  # what all_to_all_single really sends: the fixed-capacity rows, padding included
            return [
                Collective(
                    "all_to_all",
                    "ep",
                    E,
                    chunks,
                    t["buffer_sent_remote"] * (width_bytes + SLOT_ID_BYTES),
                    "dispatch (expert inputs)",
                ),
                Collective(
                    "all_to_all", "ep", E, chunks, t["buffer_received_remote"] * width_bytes, "combine (expert outputs)"
                ),
            ]
        return [
            Collective("all_to_all", "ep", E, 1, (E - 1) * chunks * a["max_local"] * 4, "split sizes"),
            Collective("all_to_all", "ep", E, chunks, t["sent_remote"] * width_bytes, "dispatch (expert inputs)"),
            Collective("all_to_all", "ep", E, chunks, t["received_remote"] * width_bytes, "combine (expert outputs)"),
        ]
    return []


def collective_op_tiles(op: SuperOp, program: Program):
    """``tiles(rows, context, sequences)``: one per launch for a collective; the local experts' GEMV tiles for
    ``moe_ep`` (experts touched x intermediate tiles)."""

    def tiles(rows: int, context: int = 0, sequences: int | None = None) -> int:
        if op.kind == "moe_ep":
            return max(1, moe_ep_traffic(op, rows)["touched"]) * math.ceil(op.attrs["moe"].intermediate_size / TILE_N)
        return 1

    return tiles


STEP_MESSAGE_BYTES_PER_ROW = 24  # token id, slot, position (the engine's step broadcast)
STEP_MESSAGE_HEADER_BYTES = 256


def step_io_collectives(
    world: int, dp: int, is_rank0: bool, leads_other_group: bool, rows: int, vocab: int
) -> list[Collective]:
    """The multi-rank engine's own traffic per step on one rank: rank 0 broadcasts the step inputs of
    all ``dp`` attention groups to the other ranks; the first rank of every other group returns its
    ``rows`` rows of fp32 logits to rank 0."""
    out = []
    if world > 1 and is_rank0:
        out.append(
            Collective(
                "broadcast",
                "world",
                world,
                1,
                (world - 1) * (STEP_MESSAGE_BYTES_PER_ROW * rows * dp + STEP_MESSAGE_HEADER_BYTES),
                "step inputs",
            )
        )
    if leads_other_group:
        out.append(Collective("send", "world", 2, 1, rows * vocab * 4, "logits to rank 0"))
    return out
