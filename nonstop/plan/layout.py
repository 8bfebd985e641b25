"""Per-rank traffic and collectives of one decode step under a parallel layout.

TO BE REPLACED: this is the planner's minimal adapter until ``nonstop/dist`` (branch dist11) provides
the engine's own ``Layout`` and its shapes-only per-rank weight bytes and collective list; the time
model (``timing.py``) only consumes ``RankOp`` / ``Collective`` lists and does not change.

Layout: ``tp`` ranks split attention heads and dense matrices (one attention group), ``dp`` attention
groups hold disjoint sequences, world = tp·dp ranks. Routed experts: ``ep`` = 1 keeps every expert in
each attention group, each split tp ways; ``ep`` > 1 places E/ep whole experts on each of ep rank
groups, each expert split etp = world/ep ways, tokens exchanged by all-to-all dispatch/combine.

Distinct experts: R = B·(K+1) routed rows each pick k of E experts, so an expert is touched with
p = 1 - (1 - k/E)^R; a rank holding n = E/ep experts streams the most-loaded rank's count
E[max over ep ranks of Binomial(n, p)] (the step waits for the busiest rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nonstop.plan.workload import PlanError, Workload

DISPATCH_BYTES = 1  # fp8 tokens to the experts (DeepEP low-latency / vLLM / SGLang default)
COMBINE_BYTES = 2  # bf16 expert outputs back
ACT_BYTES = 2  # bf16 hidden states in TP all-reduces


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    dp: int = 1
    ep: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.dp

    @property
    def etp(self) -> int:
        """Ranks one expert is split over."""
        return self.tp if self.ep == 1 else self.world // self.ep

    def describe(self) -> str:
        return f"TP{self.tp}" + (f" DP{self.dp}" if self.dp > 1 else "") + (f" EP{self.ep}" if self.ep > 1 else "")


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
    kind: str  # all_reduce | reduce_scatter | all_gather | all_to_all
    ranks: int
    bytes: float  # message per rank (all_reduce / all_gather: the full tensor; all_to_all: sent)
    count: int  # per step
    label: str


def check_layout(workload: Workload, layout: Layout) -> None:
    cfg = workload.cfg
    for name, value in (("tp", layout.tp), ("dp", layout.dp), ("ep", layout.ep)):
        if value < 1:
            raise PlanError(f"--{name} must be >= 1, got {value}")
    heads = [
        h for h in (cfg.kda and cfg.kda.num_heads, cfg.mla and cfg.mla.num_heads, cfg.gqa and cfg.gqa.num_heads) if h
    ]
    for h in heads:
        if h % layout.tp:
            raise PlanError(f"--tp {layout.tp} does not divide the {h} attention heads of {workload.name}")
    if layout.ep > 1:
        if not workload.moe_ops:
            raise PlanError(f"{workload.name} has no routed experts: --ep must be 1")
        if layout.world % layout.ep:
            raise PlanError(f"--ep {layout.ep} must divide the {layout.world} ranks (tp {layout.tp} x dp {layout.dp})")
        experts = workload.moe_ops[0].expert.num_experts
        if layout.ep > experts:
            raise PlanError(f"--ep {layout.ep} exceeds the {experts} routed experts")


def expected_max_binomial(n: int, p: float, groups: int) -> float:
    """E[max of ``groups`` independent Binomial(n, p)] = sum_x (1 - F(x)^groups)."""
    if groups == 1 or p <= 0.0 or p >= 1.0:
        return n * p
    total, cdf, pmf = 0.0, 0.0, (1 - p) ** n
    for x in range(n):
        cdf += pmf
        total += 1.0 - min(cdf, 1.0) ** groups
        pmf *= (n - x) / (x + 1) * p / (1 - p)
        if 1.0 - min(cdf, 1.0) ** groups < 1e-12 and x > n * p:
            break
    return total


def experts_touched(num_experts: int, top_k: int, routed_rows: int, ep: int) -> float:
    """Distinct experts the busiest of ``ep`` expert groups streams for ``routed_rows`` rows."""
    p = 1.0 - (1.0 - top_k / num_experts) ** routed_rows
    return expected_max_binomial(math.ceil(num_experts / ep), p, ep)


def rank_ops(workload: Workload, layout: Layout, batch: int, context: int, rows_per_seq: int) -> list[RankOp]:
    """Work of the busiest rank: its attention group's sequences, its share of the experts."""
    seqs = math.ceil(batch / layout.dp)
    rows = seqs * rows_per_seq
    routed_rows = batch * rows_per_seq
    tp = layout.tp
    out = []
    for op in workload.ops:
        if op.expert is not None:
            ex = op.expert
            if layout.ep > 1:  # experts see every group's rows; each rank computes 1/world of the pairs
                touched, flops = (
                    experts_touched(ex.num_experts, ex.top_k, routed_rows, layout.ep),
                    2 * ex.params_each * routed_rows * ex.top_k / layout.world,
                )
            else:  # each attention group holds all experts (split tp ways) and routes only its rows
                touched, flops = (
                    experts_touched(ex.num_experts, ex.top_k, rows, 1),
                    2 * ex.params_each * rows * ex.top_k / tp,
                )
            out.append(
                RankOp(
                    op.name,
                    op.kind,
                    touched * ex.bytes_each / layout.etp + op.weight_bytes,
                    rows * op.act_bytes_per_row,
                    flops,
                    op.dtype,
                    touched,
                )
            )
            continue
        weight = (op.weight_bytes - op.replicated_bytes) / tp + op.replicated_bytes
        state = (
            rows * op.act_bytes_per_row
            + seqs * op.state_bytes_per_seq / tp
            + rows * context * op.cache_bytes_per_row_ctx * _cache_share(workload, op, tp)
        )
        flops = (rows * op.flops_per_row + rows * context * op.flops_per_row_ctx) / tp
        out.append(RankOp(op.name, op.kind, weight, state, flops, op.dtype))
    return out


def _cache_share(workload: Workload, op, tp: int) -> float:
    """Fraction of an attention cache one TP rank reads: MLA's latent is shared by all heads, so every
    rank reads all of it; GQA splits its KV heads (replicated when there are fewer than tp)."""
    if op.kind == "gqa_attn":
        return 1.0 / min(tp, workload.cfg.gqa.num_kv_heads)
    return 1.0


def collectives(workload: Workload, layout: Layout, batch: int, rows_per_seq: int) -> list[Collective]:
    """Every collective one rank takes part in during one step, grouped by kind and size."""
    cfg = workload.cfg
    tp, d = layout.tp, workload.hidden
    rows = math.ceil(batch / layout.dp) * rows_per_seq
    n_layers = cfg.num_hidden_layers
    n_moe = len(workload.moe_ops)
    out: list[Collective] = []
    if tp > 1:
        out.append(Collective("all_reduce", tp, rows * d * ACT_BYTES, n_layers, "attention output (TP)"))
        n_dense = n_layers - n_moe
        if n_dense:
            out.append(Collective("all_reduce", tp, rows * d * ACT_BYTES, n_dense, "dense MLP output (TP)"))
        out.append(Collective("all_gather", tp, rows * cfg.vocab_size * 4, 1, "LM-head logits (TP)"))
    if not n_moe:
        return out
    ex = workload.moe_ops[0].expert
    if layout.ep == 1:
        if tp > 1:
            if cfg.moe.latent_size:  # K3: the routed latent sum must be complete before its RMSNorm
                out.append(
                    Collective(
                        "all_reduce",
                        tp,
                        rows * ex.width * ACT_BYTES,
                        n_moe,
                        "routed latent sum (TP, before the latent norm)",
                    )
                )
            out.append(Collective("all_reduce", tp, rows * d * ACT_BYTES, n_moe, "MoE output (TP)"))
        return out
    local = rows / tp  # tokens leave from the rank that owns them after a reduce-scatter
    peers = (layout.ep - 1) / layout.ep
    if tp > 1:
        out.append(
            Collective("reduce_scatter", tp, rows * d * ACT_BYTES, n_moe, "attention output to token shards (TP)")
        )
        out.append(Collective("all_gather", tp, rows * d * ACT_BYTES, n_moe, "MoE output back to the TP group"))
    sent = local * ex.top_k * ex.width * layout.etp * peers
    out.append(Collective("all_to_all", layout.world, sent * DISPATCH_BYTES, n_moe, "MoE dispatch (EP, fp8)"))
    out.append(Collective("all_to_all", layout.world, sent * COMBINE_BYTES, n_moe, "MoE combine (EP, bf16)"))
    return out


def resident_bytes(workload: Workload, layout: Layout, batch: int, context: int) -> dict:
    """Bytes one rank holds: weights (its experts whole), KDA state and attention cache of its sequences."""
    seqs = math.ceil(batch / layout.dp)
    weights = 0.0
    for op in workload.ops:
        if op.expert is not None:
            ex = op.expert
            held = ex.num_experts if layout.ep == 1 else math.ceil(ex.num_experts / layout.ep)
            weights += held * ex.bytes_each / layout.etp + op.weight_bytes
        else:
            weights += (op.weight_bytes - op.replicated_bytes) / layout.tp + op.replicated_bytes
    state = seqs * workload.state_bytes_per_seq() / layout.tp
    cache = sum(
        seqs * context * op.cache_bytes_per_row_ctx * _cache_share(workload, op, layout.tp) for op in workload.ops
    )
    return {"weights": weights, "state": state, "cache": cache}
