"""Per-rank traffic and collectives of one decode step under a parallel layout, from ``nonstop.dist``.

A plan layout is ``tp`` ranks per attention group, ``dp`` attention groups (world = tp·dp ranks) and
``ep`` for the routed experts:

* ``ep`` > 1: ``nonstop.dist``'s expert parallelism - whole experts spread over expert groups of ep
  ranks (each group holds every expert), tokens exchanged by all-to-all dispatch / combine; with dp 1 and
  ep = tp (``tokens_replicated``, production sharding) the one attention group already holds every token,
  so no all-to-all runs: each rank applies its experts to every row and the MoE output all-reduce (K3:
  also the routed latent sum) combines them, as vLLM / SGLang expert parallelism without DP attention does;
* ``ep`` = 1 with tp > 1: experts *tensor*-parallel inside each attention group (every expert split
  tp ways by its intermediate dimension: vLLM's and SGLang's default without expert parallelism). The
  engine's ``dist.Layout`` has no such mode yet; the planner takes the rank Program of the same
  per-rank bytes (``Layout.make(tp, ep=tp)``) and replaces the token exchange by the all-reduce of the
  routed sum (K3: before the latent RMSNorm, which is not linear; the MoE output all-reduce follows);
* ``ep`` = 1 with dp > 1 (``moe_world_tp``, production sharding): DP attention with the experts
  tensor-parallel over all tp·dp ranks, as vLLM does for DP > 1 without ``--enable-expert-parallel`` and
  SGLang with ``--enable-dp-attention`` without ``--ep``: every attention group's rows are all-gathered
  over the dp groups before the experts, each rank streams 1/world of every touched expert for all of
  them, and the routed outputs are all-reduced over the world (the rank Program of the same per-rank
  bytes is ``Layout.make(tp, ep=world)``). ``sharding="engine"`` keeps ``nonstop.dist``'s meaning
  (every attention group holds every expert).

Every rank's weights, ops and collective sizes come from ``dist.program.shapes_program`` (shapes only).
The step waits for the busiest rank: routed experts are counted as the expected maximum over the
expert group's ranks. R rows routed into an expert group each pick k of E experts, so an expert is
touched with p = 1 - (1 - k/E)^R and a rank holding n experts streams E[max of ep Binomial(n, p)]; R is
what rank 0's expert group, the busiest, really routes (``busiest_expert_group_rows``), never more rows
than the batch has.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from nonstop.dist.layout import Layout as DistLayout
from nonstop.dist.layout import LayoutError
from nonstop.plan.workload import (
    COLLECTIVE_KINDS,
    PlanError,
    Precision,
    Workload,
    build_workload,
    cfg_json,
    shapes_from_json,
)
from nonstop.program.cost import (
    STEP_MESSAGE_BYTES_PER_ROW,
    STEP_MESSAGE_HEADER_BYTES,
    all_gather_wire_bytes,
    all_reduce_wire_bytes,
    op_collectives,
    owned_rows,
    routed_rows,
)
from nonstop.program.cost import Collective as DistCollective

SHARDINGS = ("production", "engine")


@dataclass(frozen=True)
class Layout:
    """``sharding``: "engine" = exactly ``nonstop.dist``'s parts; "production" = the same, but K3's latent
    projections split tp ways as vLLM / SGLang / the TPU megakernel do (``workload.PRODUCTION_SPLIT``).
    ``pp``: pipeline stages, each a copy of the tp x dp (x ep) layout holding 1/pp of the layers
    (``predict`` prices a stage with ``stage`` and adds the sends between stages)."""

    tp: int = 1
    dp: int = 1
    ep: int = 1
    sharding: str = "production"
    pp: int = 1
    dcp: int = 1  # decode context parallel: each attention group's cached tokens split over dcp of its tp ranks

    @property
    def world(self) -> int:
        """Every rank of the deployment (all pipeline stages)."""
        return self.tp * self.dp * self.pp

    @property
    def stage_ranks(self) -> int:
        return self.tp * self.dp

    @property
    def stage(self) -> Layout:
        """One pipeline stage's layout (the whole layout when pp is 1)."""
        return Layout(self.tp, self.dp, self.ep, self.sharding, 1, self.dcp)

    def fullest_stage_share(self, layers: int) -> float:
        """The share of the model the fullest pipeline stage holds: ceil(layers / pp) / layers (stages differ
        by a layer at most; 1 without pipelining)."""
        return math.ceil(layers / self.pp) / layers

    @property
    def moe_world_tp(self) -> bool:
        """DP attention with the routed experts split over all tp·dp ranks (production sharding, ep 1, dp > 1)."""
        return self.sharding == "production" and self.ep == 1 and self.dp > 1

    @property
    def expert_tp(self) -> bool:
        """Routed experts split tp ways inside each attention group (no token exchange)."""
        return self.ep == 1 and self.tp > 1 and not self.moe_world_tp

    @property
    def expert_split(self) -> int:
        """Ways each routed expert is split by its intermediate dimension (1: whole experts)."""
        return self.stage_ranks if self.moe_world_tp else self.tp if self.expert_tp else 1

    @property
    def expert_ranks(self) -> int:
        """Ranks that share a copy of the routed experts (split by intermediate dimension, or spread whole)."""
        return self.expert_split if self.expert_split > 1 else self.ep

    @property
    def tokens_replicated(self) -> bool:
        """Whole experts spread over the one attention group that already holds every token (dp 1, ep = tp):
        vLLM / SGLang expert parallelism without DP attention run no all-to-all; each rank applies its own
        experts to every row and the MoE output all-reduce combines them. ``sharding="engine"`` keeps
        ``nonstop.dist``'s dispatch / combine."""
        return self.sharding == "production" and self.dp == 1 and self.ep == self.tp > 1

    def dist_layout(self) -> DistLayout:
        """The engine's layout with the same per-rank bytes (see the module docstring)."""
        return DistLayout.make(self.tp, self.expert_ranks, self.stage_ranks)

    def weight_bytes(self, op, held: bool = False) -> float:
        """The bytes of ``op``'s weights one rank streams (``held``: keeps) under this layout's sharding."""
        nbytes = op.held_bytes if held else op.weight_bytes
        if self.sharding == "production" and self.tp > 1:
            return nbytes - op.engine_replicated_bytes * (1 - 1 / self.tp)
        return nbytes

    def describe(self, routed_experts: bool = True) -> str:
        """The layout as the report names it ("TP4 DP2 EP8 PP2"); ``routed_experts`` False (a dense model)
        leaves out how experts are placed, as there are none."""
        experts = f"EP{self.ep}" if self.ep > 1 else ("experts TP" if self.expert_tp else "")
        experts = f"experts TP{self.stage_ranks}" if self.moe_world_tp else experts
        experts = experts if routed_experts else ""
        parts = (
            f"TP{self.tp}",
            f"DCP{self.dcp}" if self.dcp > 1 else "",
            f"DP{self.dp}" if self.dp > 1 else "",
            experts,
            f"PP{self.pp}" if self.pp > 1 else "",
        )
        return " ".join(x for x in parts if x)


@dataclass(frozen=True)
class RankOp:
    """One op's work on the busiest rank for one step."""

    name: str
    kind: str
    weight_bytes: float
    state_bytes: float  # KDA state, attention cache, activations
    flops: float
    dtype: str
    expert_slices: float = 0.0  # distinct expert weight slices streamed (routed experts only)


@dataclass(frozen=True)
class Collective:
    kind: str  # all_reduce | all_gather | reduce_scatter | gather | all_to_all | broadcast | send
    ranks: int
    wire_bytes: float  # sent by this rank per step, all calls (a gather to it: received)
    count: int  # calls per step
    label: str
    crosses: bool = False  # a point-to-point send between scale-up domains (``ranks`` alone cannot say)
    stride: int = 1  # rank distance between the group's neighbours (a dp group: tp; contiguous ranks: 1)


def check_layout(workload: Workload, layout: Layout) -> None:
    if layout.pp < 1:  # before ``stage`` (pp 1): a pipeline of 0 or -1 stages is no layout
        raise PlanError(f"--pp must be >= 1, got {layout.pp}")
    if layout.pp > workload.cfg.num_hidden_layers:
        raise PlanError(f"--pp {layout.pp} exceeds the {workload.cfg.num_hidden_layers} layers of {workload.name}")
    layout = layout.stage
    for name, value in (("tp", layout.tp), ("dp", layout.dp), ("ep", layout.ep), ("dcp", layout.dcp)):
        if value < 1:
            raise PlanError(f"--{name} must be >= 1, got {value}")
    if layout.dcp > 1:
        if layout.tp % layout.dcp:
            raise PlanError(f"--dcp {layout.dcp} must divide --tp {layout.tp} (it splits an attention group's cache)")
        if not workload.cache_bytes_per_token():
            raise PlanError(f"{workload.name} keeps no attention cache to split: --dcp must be 1")
        gqa = workload.cfg.gqa
        copies = max(1, layout.tp // gqa.num_kv_heads) if gqa is not None else layout.tp
        if layout.dcp > copies:
            raise PlanError(
                f"--dcp {layout.dcp}: decode context parallelism splits the tokens of the copies of each KV head an "
                f"attention group keeps, and {workload.name}'s {gqa.num_kv_heads} KV heads over --tp {layout.tp} are "
                f"kept {copies}x: --dcp at most {copies} (an MLA latent, whole on every rank, takes --dcp up to --tp)"
            )
    if layout.sharding not in SHARDINGS:
        raise PlanError(f"unknown sharding {layout.sharding!r}; choose one of: {', '.join(SHARDINGS)}")
    if layout.ep > 1 and not workload.moe_ops:
        raise PlanError(f"{workload.name} has no routed experts: --ep must be 1")
    if layout.ep > 1 and layout.ep > workload.moe_ops[0].expert.num_experts:
        raise PlanError(f"--ep {layout.ep} exceeds the {workload.moe_ops[0].expert.num_experts} routed experts")
    try:
        from nonstop.dist.shard import check_layout as check_shapes

        check_shapes(workload.cfg, layout.dist_layout())
    except LayoutError as exc:
        raise PlanError(str(exc)) from None


@functools.lru_cache(maxsize=32)
def _rank_workload(
    cfg_text: str, name: str, precision: Precision, tp: int, dp: int, ep: int, sharding: str
) -> Workload:
    from nonstop.dist.program import shapes_program

    cfg = shapes_from_json(cfg_text)
    layout = Layout(tp, dp, ep, sharding)
    program = shapes_program(cfg, layout.dist_layout(), rank=0)
    return build_workload(cfg, name, precision, program)


def rank_workload(workload: Workload, layout: Layout) -> Workload:
    """Rank 0's part of ``workload`` under ``layout`` (the single-device workload when world is 1)."""
    check_layout(workload, layout)
    if layout.world == 1:
        return workload
    return _rank_workload(
        cfg_json(workload.cfg), workload.name, workload.precision, layout.tp, layout.dp, layout.ep, layout.sharding
    )


def with_sharding(layout: Layout, sharding: str) -> Layout:
    return dataclasses.replace(layout, sharding=sharding, pp=1)


def expected_max_binomial(n: int, p: float, groups: int) -> float:
    """E[max of ``groups`` independent Binomial(n, p)] = sum_x (1 - F(x)^groups)."""
    if groups == 1 or p <= 0.0 or p >= 1.0:
        return n * p
    total, cdf, pmf = 0.0, 0.0, (1 - p) ** n
    for x in range(n):
        cdf += pmf
        tail = 1.0 - min(cdf, 1.0) ** groups
        total += tail
        if tail < 1e-12 and x > n * p:
            break
        pmf *= (n - x) / (x + 1) * p / (1 - p)
    return total


def experts_touched(num_experts: int, top_k: int, routed_rows: float, local: int, ranks: int) -> float:
    """Distinct experts the busiest of ``ranks`` ranks (``local`` experts each) streams for ``routed_rows``."""
    p = 1.0 - (1.0 - top_k / num_experts) ** routed_rows
    return expected_max_binomial(local, p, ranks)


def attention_group_rows(layout: Layout, batch: int, rows_per_seq: int) -> tuple[int, ...]:
    """Rows of each attention group in a step of ``batch`` sequences: the engine puts slot s in group
    s mod dp (``nonstop/engine/distributed.py``), so the first batch mod dp groups hold one sequence more."""
    return tuple(owned_rows(batch, layout.dp, g) * rows_per_seq for g in range(layout.dp))


def busiest_expert_group_rows(layout: Layout, batch: int, rows_per_seq: int) -> int:
    """Rows routed into rank 0's expert group, the busiest (the first attention groups, and the first
    ranks of a group, hold the most rows): every row of the batch when the experts are split over the
    world; the group's own rows when it holds every expert; else the rows its ranks route
    (``cost.routed_rows``: an attention group's tp ranks route contiguous parts of its rows)."""
    if layout.moe_world_tp:
        return batch * rows_per_seq
    groups = attention_group_rows(layout, batch, rows_per_seq)
    if layout.expert_split > 1 or layout.ep == 1:
        return groups[0]
    return sum(routed_rows(groups, layout.tp, layout.ep, 0))


def rank_ops(
    rank: Workload, layout: Layout, batch: int, context: int, rows_per_seq: int, logit_rows_per_seq: int | None = None
) -> list[RankOp]:
    """Work of rank 0 (its attention group's sequences, its expert group's routed rows) for one step of a
    one-stage layout (``Layout.stage``; ``predict`` composes the pipeline stages). ``logit_rows_per_seq``:
    the rows of a sequence the LM head computes logits for (default every row; a prefill's last only)."""
    seqs = math.ceil(batch / layout.dp)
    rows = seqs * rows_per_seq
    routed = busiest_expert_group_rows(layout, batch, rows_per_seq)
    out = []
    for op in rank.ops:
        if op.kind in COLLECTIVE_KINDS:
            continue
        if op.expert is not None:
            ex = op.expert
            if layout.expert_split > 1:  # every rank streams 1/split of each touched expert: balanced
                touched = experts_touched(ex.num_experts, ex.top_k, routed, ex.num_experts, 1)
                split = layout.expert_split
                weight, pairs = touched * ex.bytes_each / split, routed * ex.top_k / split
            else:
                ranks = max(1, layout.ep)
                touched = experts_touched(ex.num_experts, ex.top_k, routed, ex.local, ranks)
                weight, pairs = touched * ex.bytes_each, routed * ex.top_k * ex.local / ex.num_experts
            flops = 2 * ex.params_each * pairs
            out.append(
                RankOp(
                    op.name, op.kind, weight + op.weight_bytes, rows * op.act_bytes_per_row, flops, op.dtype, touched
                )
            )
            continue
        op_rows = seqs * logit_rows_per_seq if op.kind == "lm_head" and logit_rows_per_seq else rows
        state = (
            op_rows * op.act_bytes_per_row
            + seqs * op.state_bytes_per_seq
            + seqs * context * op.cache_bytes_per_seq_ctx / layout.dcp
        )
        flops = op_rows * op.flops_per_row + op_rows * context * op.flops_per_row_ctx
        out.append(RankOp(op.name, op.kind, layout.weight_bytes(op), state, flops, op.dtype))
    return out


def collectives(
    rank: Workload, layout: Layout, batch: int, rows_per_seq: int, logit_rows_per_seq: int | None = None
) -> list[Collective]:
    """Every collective rank 0 takes part in during one step (``dist`` program's own sizes; the logits
    gathered for ``logit_rows_per_seq`` rows a sequence, as ``rank_ops``)."""
    if layout.world == 1:
        return []
    from nonstop.dist.program import merged

    program, cfg = rank.program, rank.cfg
    seqs = math.ceil(batch / layout.dp)
    rows = seqs * rows_per_seq
    found = []
    for op in program.ops:
        if op.kind == "vocab_gather":
            found.append(_logits_gather(program, op, seqs * (logit_rows_per_seq or rows_per_seq)))
            continue
        if op.kind == "moe_ep" and layout.moe_world_tp:
            found += _world_tp_exchange(program, layout, rows, bool(cfg.moe.latent_size))
            continue
        if op.kind == "moe_ep" and (layout.expert_tp or layout.tokens_replicated):
            if cfg.moe.latent_size:  # the routed latent sum, complete before its RMSNorm
                nbytes = rows * _row_bytes(program, "moe_out")
                label = "routed latent sum (experts TP)" if layout.expert_tp else "routed latent sum (experts EP)"
                found.append(
                    DistCollective("all_reduce", "tp", layout.tp, 1, all_reduce_wire_bytes(nbytes, layout.tp), label)
                )
            continue
        found += op_collectives(op, program, rows)
    found = merged(found) + _step_inputs(cfg, layout, rows) + _dcp_exchange(rank, layout, rows)
    return [
        Collective(c.kind, c.ranks, c.wire_bytes, c.count, f"{c.purpose} ({c.group})", stride=_stride(layout, c.group))
        for c in found
        if c.count
    ]


def _stride(layout: Layout, group: str) -> int:
    """The rank distance between neighbours of a ``group`` collective: a dp group joins the same tp rank of
    every attention group (ranks r, r + tp, ...); the other groups are contiguous ranks."""
    return layout.tp if group == "dp" else 1


def _logits_gather(program, op, rows: int):
    """The LM head's vocabulary parts gathered on the attention group's first rank, which samples: rank 0
    receives the other tp - 1 parts of every row's fp32 logits (``cost.op_collectives`` counts what a
    rank sends, none for rank 0)."""
    tp = op.attrs["tp_ranks"]
    part = rows * program.buffers[op.reads[0]].row_numel * 4
    return DistCollective("gather", "tp", tp, 1, all_gather_wire_bytes(part, tp), "logits (vocabulary parts)")


def _step_inputs(cfg, layout: Layout, rows: int) -> list:
    """How a step's inputs reach the ranks. ``engine``: as ``nonstop.dist`` runs, rank 0 broadcasts every
    group's rows to the world and the other groups' leaders return logits. ``production``: each attention
    group schedules and samples its own sequences (vLLM / SGLang DP ranks), so only its own ``rows`` go to
    its tp ranks, one pipelined broadcast (each rank forwards the message once)."""
    from nonstop.dist.program import engine_collectives

    if layout.sharding == "engine":
        return engine_collectives(cfg, layout.dist_layout(), 0, rows)
    if layout.tp == 1:
        return []
    message = STEP_MESSAGE_BYTES_PER_ROW * rows + STEP_MESSAGE_HEADER_BYTES
    return [DistCollective("broadcast", "tp", layout.tp, 1, message, "step inputs")]


def _dcp_exchange(rank: Workload, layout: Layout, rows: int) -> list:
    """Decode context parallelism's traffic, per attention layer that keeps a cache: each of the dcp ranks
    holds 1/dcp of every sequence's cached tokens, so the queries of the group's heads are all-gathered
    over the dcp ranks, each rank attends over its tokens for all of them, and the partial outputs with
    their log-sum-exp are reduce-scattered back to the ranks that own the heads (vLLM's and SGLang's DCP).
    MLA attends in the latent space (queries of kv_lora + rope, outputs of kv_lora per head)."""
    if layout.dcp == 1:
        return []
    cfg, n = rank.cfg, layout.dcp
    layers = sum(1 for op in rank.ops if op.cache_bytes_per_seq_ctx)
    elt = rank.program.dtype.itemsize
    if cfg.mla is not None:
        heads, q_width, out_width = cfg.mla.num_heads, cfg.mla.cache_dim, cfg.mla.kv_lora_rank
    else:
        heads, q_width, out_width = cfg.gqa.num_heads, cfg.gqa.head_dim, cfg.gqa.head_dim
    local = heads / layout.tp
    queries = all_gather_wire_bytes(rows * local * q_width * elt, n)
    partials = (n - 1) / n * rows * local * n * (out_width * elt + 4)  # + one fp32 log-sum-exp per head
    return [
        DistCollective("all_gather", "dcp", n, layers, layers * queries, "queries of the group's heads (DCP)"),
        DistCollective("reduce_scatter", "dcp", n, layers, layers * partials, "partial attention outputs (DCP)"),
    ]


def _row_bytes(program, buffer: str) -> int:
    spec = program.buffers[buffer]
    return spec.row_numel * spec.torch_dtype(program.dtype).itemsize


def _world_tp_exchange(program, layout: Layout, rows: int, latent: bool) -> list:
    """One MoE layer's traffic with DP attention and the experts tensor-parallel over the world: the expert
    inputs of every attention group all-gathered over the dp groups, the routed outputs (K3: the routed
    latent sum, before its RMSNorm) of all of them all-reduced over the world; the shared expert's partial
    sums stay in the program's tp all-reduce."""
    gathered = all_gather_wire_bytes(rows * _row_bytes(program, "moe_in"), layout.dp)
    ranks = layout.stage_ranks
    summed = all_reduce_wire_bytes(rows * layout.dp * _row_bytes(program, "moe_out"), ranks)
    what = "routed latent sum" if latent else "routed expert outputs"
    return [
        DistCollective("all_gather", "dp", layout.dp, 1, gathered, "expert inputs of every attention group"),
        DistCollective("all_reduce", "world", ranks, 1, summed, f"{what} (experts TP over the world)"),
    ]


def stage_sends(layout: Layout, chip_domain_ranks: int, rows: int, width_bytes: int) -> list[Collective]:
    """The sends between ``layout.pp`` pipeline stages for one micro-batch of ``rows`` rows per attention
    group (each a ``width_bytes`` activation row): pp - 1 point-to-point sends, those at a scale-up domain
    boundary (stages placed in rank order) over the scale-out network."""
    if layout.pp == 1:
        return []
    boundaries = layout.pp - 1
    crossing = min(boundaries, math.ceil(layout.world / chip_domain_ranks) - 1)
    part = rows * width_bytes
    return [
        Collective("send", 2, part * n, n, label, crosses)
        for n, crosses, label in (
            (boundaries - crossing, False, "activations to the next pipeline stage"),
            (crossing, True, "activations to the next pipeline stage (scale-out)"),
        )
        if n
    ]


def resident_bytes(rank: Workload, layout: Layout, batch: int, context: int) -> dict:
    """Bytes rank 0 holds: its weights (every local expert), KDA state and attention cache of its sequences."""
    seqs = math.ceil(batch / layout.dp)
    state = seqs * sum(op.state_bytes_per_seq for op in rank.ops) / 2
    cache = seqs * context * sum(op.cache_bytes_per_seq_ctx for op in rank.ops) / layout.dcp
    weights = sum(
        layout.weight_bytes(op, held=True) + (op.expert.bytes_each * op.expert.local if op.expert else 0)
        for op in rank.ops
    )
    return {"weights": weights, "state": state, "cache": cache}
