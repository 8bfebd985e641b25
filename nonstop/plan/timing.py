"""The time model of one decode step on the busiest rank (equations: docs/plan.md).

    T_step = sum_op max(bytes_op / (eta_hbm · BW), flops_op / (eta_flops · peak_dtype))     HBM / compute
           + expert_slice_us · (distinct expert slices streamed)                           expert fetch latency
           + sum_coll count · [alpha(n) + wire_bytes / link_bw]                            collectives
           + kernel_factor · launch_us · kernels                                           launch gaps
           + step_overhead_us                  (kernels; eager on an accelerator)          host loop per step
           + T_draft                                                                       speculative draft

    alpha(n) = hop_factor · (latency_up · log2 n_up + latency_out · log2 n_out)

n_up / n_out: the group's ranks inside one scale-up domain / the domains it spans (``group_span``: a group
of ranks r, r + s, ... puts floor(D / s) of them in a domain of D ranks). ``kernel_factor`` is
a fixed prior (1: a kernel costs the catalogue's measured graph launch gap); the per-step overhead of a
host-driven engine (scheduler, sampling, graph replay) is the fitted ``step_overhead_us``: the calibration
points all run ~1,050 kernels a step, so they fix the sum of the two, not the split. Only the constants
(``Constants``) are fitted; everything else comes from the Program, the layout and the chip catalogue.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from nonstop.plan.chips import Chip
from nonstop.plan.layout import Collective, Layout, RankOp

CONSTANTS = Path(__file__).with_name("constants.json")
FITTED = ("eta_hbm", "step_overhead_us", "hop_factor", "expert_slice_us")


@dataclass(frozen=True)
class Constants:
    eta_hbm: float  # achieved fraction of peak HBM bandwidth when streaming weights
    eta_flops: float  # achieved fraction of the dtype's dense tensor peak
    kernel_factor: float  # launch gap per kernel, in units of the chip's graph launch cost (fixed prior: 1)
    step_overhead_us: float  # per decode step of a host-driven engine (executor "kernels"): scheduler, sampling
    hop_factor: float  # link-latency multiplier per log2 of the ranks in a collective
    expert_slice_us: float  # fixed cost per distinct routed-expert weight slice a rank streams per layer

    @staticmethod
    def load(path: Path = CONSTANTS) -> Constants:
        data = json.loads(Path(path).read_text())
        return Constants(**{k: float(data[k]) for k in Constants.__dataclass_fields__})

    def replace(self, **changes) -> Constants:
        return Constants(**{**self.__dict__, **changes})


@dataclass
class CollectiveTime:
    label: str
    kind: str
    ranks: int
    count: int
    wire_bytes: float  # sent by the rank per step, all calls
    latency_ms: float  # all calls
    bandwidth_ms: float  # all calls
    crosses_scale_out: bool

    @property
    def ms(self) -> float:
        return self.latency_ms + self.bandwidth_ms


@dataclass
class StepTime:
    """One decode step on the busiest rank, in milliseconds, by component."""

    weights_ms: float = 0.0
    state_ms: float = 0.0
    compute_ms: float = 0.0
    expert_fetch_ms: float = 0.0
    launch_ms: float = 0.0
    host_ms: float = 0.0
    draft_ms: float = 0.0
    kernels: int = 0
    collectives: list[CollectiveTime] = field(default_factory=list)
    memory: str = "HBM"  # what the chip's memory is called (``Chip.memory``): RAM on a CPU

    @property
    def collectives_ms(self) -> float:
        return sum(c.ms for c in self.collectives)

    @property
    def total_ms(self) -> float:
        return (
            self.weights_ms
            + self.state_ms
            + self.compute_ms
            + self.expert_fetch_ms
            + self.collectives_ms
            + self.launch_ms
            + self.host_ms
            + self.draft_ms
        )

    def bound(self) -> str:
        """What limits the step: the largest of memory bandwidth, compute, collectives, launch/sync latency
        and the speculative drafter's own step."""
        latency = sum(c.latency_ms for c in self.collectives)
        groups = {
            f"{self.memory} bandwidth (weights)"
            if self.weights_ms >= self.state_ms
            else f"{self.memory} bandwidth (KV/KDA state)": self.weights_ms + self.state_ms,
            "compute": self.compute_ms,
            "collective latency"
            if latency >= self.collectives_ms - latency
            else "collective bandwidth": self.collectives_ms,
            "launch/sync overhead": self.launch_ms + self.host_ms + self.expert_fetch_ms,
            "speculative draft": self.draft_ms,
        }
        return max(groups, key=groups.get)


def group_span(ranks: int, stride: int, domain: int) -> tuple[int, int]:
    """(n_up, n_out) of a group of ``ranks`` ranks r, r + stride, r + 2·stride, ... placed in rank order on
    scale-up domains of ``domain`` ranks: a domain holds floor(domain / stride) of them (at least one), and
    the group spans ceil(ranks / n_up) domains."""
    inside = min(ranks, max(1, domain // stride))
    return inside, math.ceil(ranks / inside)


def collective_time(c: Collective, chip: Chip, consts: Constants) -> CollectiveTime:
    if c.crosses:  # one hop between scale-up domains
        latency_s = consts.hop_factor * chip.out_latency_us * 1e-6
        bandwidth_s = c.wire_bytes / (chip.out_gbps * 1e9 / chip.devices_per_chip)
        return CollectiveTime(
            c.label, c.kind, c.ranks, c.count, c.wire_bytes, c.count * latency_s * 1e3, bandwidth_s * 1e3, True
        )
    n = c.ranks
    inside, domains = group_span(n, c.stride, chip.up_domain_ranks)
    hops = consts.hop_factor * (
        chip.up_latency_us * math.log2(max(inside, 1)) + chip.out_latency_us * math.log2(max(domains, 1))
    )
    latency_s = hops * 1e-6 if n > 1 else 0.0
    out_frac = 1.0 - inside / n
    per_rank_up = chip.up_gbps * 1e9 / chip.devices_per_chip
    per_rank_out = chip.out_gbps * 1e9 / chip.devices_per_chip
    bandwidth_s = max((1 - out_frac) * c.wire_bytes / per_rank_up, out_frac * c.wire_bytes / per_rank_out)
    return CollectiveTime(
        c.label, c.kind, n, c.count, c.wire_bytes, c.count * latency_s * 1e3, bandwidth_s * 1e3, domains > 1
    )


def step_time(
    ops: list[RankOp],
    colls: list[Collective],
    chip: Chip,
    consts: Constants,
    executor: str = "kernels",
    eager_ops: int | None = None,
    draft=None,
    layout: Layout | None = None,
    draft_slots: int = 0,
    draft_cache_bytes: float = 0.0,
) -> StepTime:
    """``draft``: a ``DraftShape`` run once per step over ``draft_slots`` slots (tensor-parallel like the target),
    reading ``draft_cache_bytes`` of its own cache on this rank."""
    bw = consts.eta_hbm * chip.rank_hbm_bps
    t = StepTime(memory=chip.memory)
    for op in ops:
        mem = (op.weight_bytes + op.state_bytes) / bw
        comp = op.flops / (consts.eta_flops * chip.rank_flops(op.dtype))
        if comp > mem:
            t.compute_ms += comp * 1e3
        else:
            t.weights_ms += op.weight_bytes / bw * 1e3
            t.state_ms += op.state_bytes / bw * 1e3
        t.expert_fetch_ms += op.expert_slices * consts.expert_slice_us * 1e-3
    t.collectives = [collective_time(c, chip, consts) for c in colls]
    n_coll = sum(c.count for c in colls)
    if executor == "megakernel":
        t.kernels = 1
    elif executor == "eager":
        t.kernels = (eager_ops or len(ops)) + n_coll
    else:
        t.kernels = len(ops) + n_coll
    if draft is not None and draft_slots:
        tp = layout.tp if layout else 1
        mem = (draft.weight_bytes / tp + draft_cache_bytes) / bw
        comp = draft.flops_per_slot * draft_slots / tp / (consts.eta_flops * chip.rank_flops("bf16"))
        t.draft_ms = max(mem, comp) * 1e3
        if executor != "megakernel":
            t.kernels += draft.kernels
    t.launch_ms = consts.kernel_factor * chip.launch_us * t.kernels * 1e-3
    host_driven = executor == "kernels" or (executor == "eager" and chip.kind != "cpu")
    t.host_ms = consts.step_overhead_us * 1e-3 if host_driven else 0.0
    return t
