"""A rank's decode Program: the single-device Program of its model plus collective super-ops.

``distribute(program, ...)`` rewrites the Program that ``lower`` made of a rank's model (``dist/model.py``):

* ``embed`` -> ``embed_shard`` (the rows of this rank's vocabulary part, zeros elsewhere) + ``tp_all_reduce``;
* every op that adds a partial sum to the residual stream (``linear_residual`` = o_proj, dense ``mlp``,
  ``moe_tail`` = latent up-projection + shared experts) writes its part - on the attention group's first
  rank added to the stream (with the biases), on the others alone - and a ``tp_all_reduce`` sums them;
* ``moe_experts`` -> ``moe_ep``: this rank's share of the rows (contiguous parts over the attention group)
  is routed, the (token, expert) pairs go to the ranks holding the experts (``all_to_all_single`` with
  uneven splits, in ``chunks`` overlapped pieces), the experts run there and the outputs come back;
* ``lm_head`` writes this rank's vocabulary part; ``vocab_gather`` gathers the logits on the attention
  group's first rank (the one that returns them to the engine).
Without tensor parallelism only ``moe_ep`` appears; a one-rank layout leaves the Program as it is.

``rank_step(cfg, layout, rows)`` gives, from shapes alone (meta tensors, no weights), a rank's ops with
their costs, the weight bytes of every rank and every collective's kind, count and bytes on the wire.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from nonstop.config import ModelConfig
from nonstop.dist.layout import Layout
from nonstop.dist.shard import vocab_rows
from nonstop.program.cost import (
    Collective,
    attach_costs,
    op_collectives,
    step_io_collectives,
)
from nonstop.program.ir import BufferSpec, Cost, Program, SuperOp
from nonstop.program.lower import lower

RESIDUAL_KINDS = ("linear_residual", "mlp", "moe_tail")  # ops adding a partial sum to the stream
LEADER_BIASES = ("b", "down_b")


def _all_reduce(after: SuperOp, buffer: str, T: int, purpose: str) -> SuperOp:
    return SuperOp(
        f"{after.name}.all_reduce",
        "tp_all_reduce",
        after.layer,
        (buffer,),
        (buffer,),
        {},
        {"tp_ranks": T, "purpose": purpose},
    )


def _moe_ep(op: SuperOp, layout: Layout, rank: int, chunks: int, overlap: bool, exchange: str) -> SuperOp:
    mc = op.attrs["moe"]
    placement = layout.placement_for(op.layer, mc.num_experts)
    ep_rank = layout.ep_rank(rank)
    attrs = dict(op.attrs)
    attrs.update(
        placement=placement,
        ep_ranks=layout.ep,
        tp_ranks=layout.tp,
        tp_rank=layout.tp_rank(rank),
        rank=rank,
        world=layout.world,
        exchange=exchange,
        chunks=chunks,
        overlap=overlap,
        top_k=mc.top_k,
        physical_experts=placement.physical,
        max_local=placement.max_local,
        **_expert_share(placement, ep_rank),
    )
    return SuperOp(f"L{op.layer}.moe_ep", "moe_ep", op.layer, op.reads, op.writes, dict(op.weights), attrs)


def distribute(
    program: Program,
    cfg: ModelConfig,
    layout: Layout,
    rank: int,
    chunks: int = 1,
    overlap: bool = False,
    exchange: str = "dynamic",
) -> Program:
    """The rank's Program (see the module docstring) from the Program of its model; ``exchange``: the MoE
    exchange mode its costs describe (the executor picks the mode of each step: ``dist/exchange.py``)."""
    if layout.single:
        return program
    T, leader = layout.tp, layout.tp_rank(rank) == 0
    buffers = dict(program.buffers)
    ops: list[SuperOp] = []
    for op in program.ops:
        if op.kind == "embed" and T > 1:
            shard = SuperOp(
                "embed",
                "embed_shard",
                None,
                op.reads,
                op.writes,
                op.weights,
                {"vocab_start": layout.tp_rank(rank) * vocab_rows(cfg, layout), "tp_ranks": T},
            )
            ops += [shard, _all_reduce(shard, op.writes[0], T, "embedding rows")]
        elif op.kind in RESIDUAL_KINDS and T > 1:
            if not leader:
                op.attrs["accumulate"] = False
                for name in LEADER_BIASES:
                    op.weights.pop(name, None)
            ops += [
                op,
                _all_reduce(
                    op,
                    op.writes[0],
                    T,
                    "partial sums of "
                    + {"linear_residual": "o_proj", "mlp": "the dense MLP", "moe_tail": "MoE outputs"}[op.kind],
                ),
            ]
        elif op.kind == "moe_front" and "shared_gate_up" in op.weights:
            op.attrs["shared_width"] = op.weights["shared_gate_up"].shape[0] // 2  # this rank's part
            buffers["moe_shared_act"] = BufferSpec("moe_shared_act", (op.attrs["shared_width"],))
            ops.append(op)
        elif op.kind == "moe_experts":
            ops.append(_moe_ep(op, layout, rank, chunks, overlap, exchange))
        elif op.kind == "lm_head" and T > 1:
            buffers["logits_shard"] = BufferSpec("logits_shard", program.buffers["logits"].row_shape, "float32")
            buffers["logits"] = BufferSpec("logits", (cfg.vocab_size,), "float32")
            op.writes = ("logits_shard",)
            ops += [
                op,
                SuperOp(
                    "logits_gather",
                    "vocab_gather",
                    None,
                    ("logits_shard",),
                    ("logits",),
                    {},
                    {"tp_ranks": T, "tp_rank": layout.tp_rank(rank), "vocab": cfg.vocab_size},
                ),
            ]
        else:
            ops.append(op)
    out = Program(program.cfg, ops, buffers, program.dtype, program.max_rows)
    attach_costs(out)
    return out


def lower_rank(model, cfg: ModelConfig, layout: Layout, rank: int, chunks: int = 1, overlap: bool = False) -> Program:
    """``distribute(lower(model))`` for a rank's model (``dist/model.py``)."""
    return distribute(lower(model), cfg, layout, rank, chunks, overlap)


# ----------------------------------------------------------------------------- shapes only


def shapes_program(
    cfg: ModelConfig,
    layout: Layout,
    rank: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    chunks: int = 1,
    exchange: str = "dynamic",
) -> Program:
    """The rank's Program built on meta tensors (no weights, no process group), its MoE costs for the
    ``exchange`` mode; cached per arguments (a planner asks for the same layouts again and again)."""
    try:
        return _cached_shapes_program(cfg, layout, rank, dtype, chunks, exchange)
    except TypeError:  # unhashable (a per-layer placement dict): build it afresh
        return _shapes_program(cfg, layout, rank, dtype, chunks, exchange)


def _shapes_program(cfg, layout, rank, dtype, chunks, exchange) -> Program:
    from nonstop.dist.shard import local_config, rank_shards

    shapes = tuple((s.spec.param, tuple(s.shape), s.spec.torch_dtype(dtype)) for s in rank_shards(cfg, layout, rank))
    program = _lowered_rank_model(local_config(cfg, layout, rank), rank, shapes)
    ops = [dataclasses.replace(op, weights=dict(op.weights), attrs=dict(op.attrs)) for op in program.ops]
    own = Program(program.cfg, ops, dict(program.buffers), program.dtype, program.max_rows)
    return distribute(own, cfg, layout, rank, chunks, exchange=exchange)


@lru_cache(maxsize=64)  # meta tensors only: a few MB each
def _lowered_rank_model(local: ModelConfig, rank: int, shapes: tuple) -> Program:
    """The Program of a rank model of config ``local`` holding meta tensors of ``shapes`` ((param, shape,
    dtype) each). Layouts whose rank holds the same parts (e.g. the same tp and expert split at another dp or
    pipeline depth) share it; ``distribute`` gets a copy of its ops, as it edits them."""
    from nonstop.dist.model import model_holding

    state = {param: torch.empty(shape, dtype=dtype, device="meta") for param, shape, dtype in shapes}
    return lower(model_holding(local, rank, state))


_cached_shapes_program = lru_cache(maxsize=16)(_shapes_program)


@dataclass
class RankStep:
    """One rank's share of a decode step of ``rows`` rows per attention group (``rows · dp`` tokens).

    ops: (name, kind, Cost) per super-op; weight_bytes: what every rank holds (list by rank);
    collectives: every collective of the step with its count and bytes sent by this rank (the Program's
    collective super-ops, then the engine's step input broadcast and logits return); exchange: the MoE
    exchange mode (dynamic | static) the costs describe."""

    cfg: ModelConfig
    layout: Layout
    rank: int
    rows: int
    context: int
    program: Program
    ops: list[tuple[str, str, Cost]]
    weight_bytes: list[int]
    collectives: list[Collective] = field(default_factory=list)
    exchange: str = "dynamic"

    @property
    def tokens(self) -> int:
        return self.rows * self.layout.dp

    @property
    def cache_bytes_per_token(self) -> int:
        """Attention-cache bytes this rank adds per cached token of one of its group's sequences (its
        key/value heads; the whole MLA latent, which every rank of the group caches)."""
        from nonstop.program.cost import cache_bytes_per_token

        return cache_bytes_per_token(self.program.cfg, self.program.dtype.itemsize)

    @property
    def state_bytes_per_sequence(self) -> int:
        """KDA recurrent state + conv windows this rank holds per sequence of its group (its heads)."""
        from nonstop.program.cost import state_bytes_per_sequence

        return state_bytes_per_sequence(self.program.cfg, self.program.dtype.itemsize)

    @property
    def total(self) -> Cost:
        total = Cost(0, 0, 0, 0)
        for _, _, c in self.ops:
            total = total + c
        return total

    @property
    def wire_bytes(self) -> float:
        return sum(c.wire_bytes for c in self.collectives)

    def launches(self, kind: str, purposes: tuple[str, ...] | None = None) -> int:
        return sum(c.count for c in self.collectives if c.kind == kind and (purposes is None or c.purpose in purposes))

    @property
    def mean_wire_bytes(self) -> float:
        """Bytes sent per step by the average rank (the attention group's ranks route different numbers
        of rows; only rank 0 broadcasts the step inputs; only group leaders return logits)."""
        T = self.layout.tp
        per_tp = [sum(c.wire_bytes for c in collectives_as(self.program, self.rows, t)) for t in range(T)]
        engine = [
            sum(c.wire_bytes for c in engine_collectives(self.cfg, self.layout, r, self.rows))
            for r in range(self.layout.world)
        ]
        return sum(per_tp) / T + sum(engine) / self.layout.world

    @property
    def wire_bytes_per_token(self) -> float:
        """Bytes on the wire per decoded token per rank: the average rank's bytes per step / tokens per step."""
        return self.mean_wire_bytes / max(1, self.tokens)

    @property
    def token_all_to_alls(self) -> int:
        """Token exchanges (dispatch + combine) per step, each counted once however many chunks it has."""
        return sum(1 for op in self.program.ops if op.kind == "moe_ep" and op.attrs["ep_ranks"] > 1) * 2


def collectives_as(program: Program, rows: int, tp_rank: int) -> list[Collective]:
    """The Program's collectives as attention-group rank ``tp_rank`` would run them (its share of rows)."""
    out = []
    for op in program.ops:
        if op.kind in ("moe_ep", "vocab_gather"):
            rank = op.attrs.get("rank", 0) - op.attrs["tp_rank"] + tp_rank
            place = _expert_share(op.attrs["placement"], rank % op.attrs["ep_ranks"]) if op.kind == "moe_ep" else {}
            op = dataclasses.replace(op, attrs={**op.attrs, "tp_rank": tp_rank, "rank": rank, **place})
        out += op_collectives(op, program, rows)
    return out


def _expert_share(placement, ep_rank: int) -> dict:
    """The attrs of a ``moe_ep`` op that say which experts expert rank ``ep_rank`` holds (``_moe_ep``'s)."""
    return {
        "ep_rank": ep_rank,
        "local_experts": len(placement.local(ep_rank)),
        "local_fraction": placement.local_fraction(ep_rank),
    }


def merged(collectives: list[Collective]) -> list[Collective]:
    """Collectives of the same kind, group and purpose summed."""
    out: dict[tuple, Collective] = {}
    for c in collectives:
        key = (c.kind, c.group, c.ranks, c.purpose)
        if key in out:
            o = out[key]
            out[key] = Collective(c.kind, c.group, c.ranks, o.count + c.count, o.wire_bytes + c.wire_bytes, c.purpose)
        else:
            out[key] = c
    return list(out.values())


def engine_collectives(cfg: ModelConfig, layout: Layout, rank: int, rows: int) -> list[Collective]:
    """The engine's own traffic on ``rank`` per step (``program/cost.step_io_collectives``)."""
    return step_io_collectives(
        layout.world, layout.dp, rank == 0, rank != 0 and layout.tp_rank(rank) == 0, rows, cfg.vocab_size
    )


def engine_exchange(
    cfg: ModelConfig,
    layout: Layout,
    rows: int,
    chunks: int,
    dtype: torch.dtype,
    device_type: str,
    requested: str = "auto",
) -> tuple[str, str]:
    """(mode, reason): the MoE exchange the engine picks (``dist/exchange.choose_exchange``, graphs on auto)
    for decode steps of ``rows`` rows per attention group on ``device_type``."""
    from nonstop.dist.exchange import choose_exchange

    program = shapes_program(cfg, layout, 0, dtype, chunks)
    moe_in = program.buffers.get("moe_in")
    width = 0 if moe_in is None else moe_in.row_numel * dtype.itemsize
    return choose_exchange(requested, program.ops, (rows,) * layout.dp, program.max_rows, device_type, False, width)


def rank_step(
    cfg: ModelConfig,
    layout: Layout,
    rows: int = 1,
    context: int = 1024,
    dtype: torch.dtype = torch.bfloat16,
    rank: int = 0,
    chunks: int = 1,
    exchange: str = "dynamic",
) -> RankStep:
    """Rank ``rank``'s ops, weights and collectives for a step of ``rows`` rows per attention group at
    ``context`` cached tokens per sequence (shapes only), the MoE tokens exchanged in the ``exchange``
    mode (dynamic | static)."""
    from nonstop.dist.model import rank_weight_bytes

    program = shapes_program(cfg, layout, rank, dtype, chunks, exchange)
    ops = [(op.name, op.kind, op.cost(rows, context)) for op in program.ops]
    collectives = [c for op in program.ops for c in op_collectives(op, program, rows)]
    collectives = merged(collectives) + engine_collectives(cfg, layout, rank, rows)
    weights = rank_weight_bytes(cfg, layout, dtype)
    return RankStep(cfg, layout, rank, rows, context, program, ops, weights, collectives, exchange)
