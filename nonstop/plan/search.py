"""Layout search: every tensor / data / expert-parallel split of N chips, the fitting ones predicted.

Candidates: pp in 1, 2, 4, 8 stages (dividing the ranks), tp over the divisors of a stage's ranks that split
the attention heads, dp = stage ranks / tp, and for a MoE model ep = 1 (experts tensor-parallel) or any
divisor of the stage's ranks >= 2.
A cheap lower bound of a rank's bytes (every weight split as far as the layout allows) drops the
layouts that cannot fit before their rank Program is built; the rest are predicted in full.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nonstop.plan.chips import Chip
from nonstop.plan.layout import Layout, check_layout
from nonstop.plan.predict import USABLE_HBM, Prediction, Requests, Spec, predict
from nonstop.plan.timing import Constants
from nonstop.plan.workload import PlanError, Workload

PIPELINE_STAGES = (1, 2, 4, 8)  # tried by the search (a stage layout per count that divides the ranks)


@dataclass
class Candidate:
    layout: Layout
    bytes_per_rank: float  # exact when ``prediction`` is set, else a lower bound
    prediction: Prediction | None = None

    @property
    def fits(self) -> bool:
        return self.prediction is not None and self.prediction.fits


def candidate_layouts(workload: Workload, ranks: int, sharding: str = "production") -> list[Layout]:
    out = []
    for pp in (p for p in PIPELINE_STAGES if ranks % p == 0):
        stage = ranks // pp
        for tp in (d for d in range(1, stage + 1) if stage % d == 0):
            eps = [1] + ([e for e in range(2, stage + 1) if stage % e == 0] if workload.moe_ops else [])
            for ep in eps:
                layout = Layout(tp, stage // tp, ep, sharding, pp)
                try:
                    check_layout(workload, layout)
                except PlanError:
                    continue
                out.append(layout)
    return out


def lower_bound_bytes(workload: Workload, layout: Layout, batch: int, context: int) -> float:
    """A rank holds at least: dense weights / tp, its experts, its sequences' KDA state / tp and their
    attention cache / s, all times the fullest pipeline stage's share of the layers; s = dcp for an MLA
    latent cache (every rank of an attention group keeps all of it unless decode context parallelism splits
    the tokens) and s = tp for a head-split GQA cache."""
    dense = sum(op.weight_bytes for op in workload.ops)
    experts = sum(op.expert.bytes_each * op.expert.num_experts for op in workload.moe_ops)
    held = experts / layout.expert_ranks
    seqs = math.ceil(batch / layout.dp)
    cache_split = layout.dcp if workload.cfg.mla is not None else layout.tp
    state = seqs * workload.state_bytes_per_seq() / layout.tp
    cache = seqs * context * workload.cache_bytes_per_token() / cache_split
    return (dense / layout.tp + held + state + cache) * layout.fullest_stage_share(workload.cfg.num_hidden_layers)


def search(
    workload: Workload,
    chip: Chip,
    chips: int,
    batch: int,
    context: int,
    spec: Spec | None = None,
    executor: str = "kernels",
    consts: Constants | None = None,
    model_dir: Path | None = None,
    sharding: str = "production",
    progress: Callable[[str], None] | None = None,
    requests: Requests | None = None,
) -> list[Candidate]:
    """Every candidate layout; those that fit first (fastest first), then the rest (smallest first: when none
    fits, the first is the layout with the least exact bytes a rank, predicted in full)."""
    ranks = chips * chip.devices_per_chip
    capacity = chip.rank_hbm_bytes * USABLE_HBM
    out = []
    layouts = candidate_layouts(workload, ranks, sharding)
    for i, layout in enumerate(layouts):
        bound = lower_bound_bytes(workload, layout, batch, context)
        if bound > capacity:
            out.append(Candidate(layout, bound))
            continue
        if progress:
            progress(f"[{i + 1}/{len(layouts)}] {layout.describe(bool(workload.moe_ops))}: building its rank Program")
        p = predict(workload, chip, layout, batch, context, spec, executor, consts, model_dir, requests)
        out.append(Candidate(layout, p.bytes_per_rank, p))
    if not any(c.fits for c in out):
        # none fits: the smallest layout is the one whose exact bytes are least, so predict in full every
        # layout whose lower bound is under the least exact bytes found so far (smallest bound first)
        least = min((c.bytes_per_rank for c in out if c.prediction), default=math.inf)
        for c in sorted(out, key=lambda c: c.bytes_per_rank):
            if c.prediction is not None or c.bytes_per_rank >= least:
                continue
            if progress:
                name = c.layout.describe(bool(workload.moe_ops))
                progress(f"{name}: building its rank Program (the smallest layout's exact bytes)")
            c.prediction = predict(
                workload, chip, c.layout, batch, context, spec, executor, consts, model_dir, requests
            )
            c.bytes_per_rank = c.prediction.bytes_per_rank
            least = min(least, c.bytes_per_rank)
    out.sort(key=lambda c: (not c.fits, c.prediction.ms_per_token if c.fits else c.bytes_per_rank))
    return out
