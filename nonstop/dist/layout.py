"""The parallel layout: which rank holds which part of the model, as plain data (no process groups).

``--tp T --ep E`` over W ranks (W = max(T, E) unless given; T and E must each divide W):

* attention and dense weights are split T ways (by heads / by columns and rows) inside *attention
  groups* of T consecutive ranks ``[g·T, (g+1)·T)``; the W / T groups run data-parallel (each decodes
  its own sequences: DP = W / T);
* routed experts are split E ways inside *expert groups* of E consecutive ranks ``[h·E, (h+1)·E)``;
  the W / E expert groups each hold every expert once (plus redundant replicas, see ``placement.py``).

Example ``--tp 2 --ep 4``: W = 4, attention groups {0,1} and {2,3} (DP 2), one expert group {0..3}.
Everything here is importable and usable without ``torch.distributed`` being initialised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nonstop.dist.placement import ExpertPlacement


class LayoutError(ValueError):
    """A layout that cannot be built (the message names the flag or the model dimension)."""


@dataclass(frozen=True)
class Layout:
    """tp: ranks per attention group; ep: ranks per expert group; world: all ranks.
    placement: expert placement per MoE layer ({layer: ExpertPlacement}), one for all layers, or None
    (every layer spread evenly: ``ExpertPlacement.even``)."""

    tp: int = 1
    ep: int = 1
    world: int = 1
    placement: ExpertPlacement | dict | None = None

    @staticmethod
    def make(tp: int = 1, ep: int = 1, world: int | None = None, placement=None) -> Layout:
        """The layout for ``--tp tp --ep ep [--world world]``; LayoutError when the sizes do not fit."""
        for flag, value in (("--tp", tp), ("--ep", ep)):
            if not isinstance(value, int) or value < 1:
                raise LayoutError(f"{flag} must be a positive integer, got {value!r}")
        w = max(tp, ep) if world is None else world
        if not isinstance(w, int) or w < 1:
            raise LayoutError(f"--world must be a positive integer, got {world!r}")
        for flag, value in (("--tp", tp), ("--ep", ep)):
            if w % value:
                hint = f"; give --world {math.lcm(tp, ep)}" if world is None else ""
                raise LayoutError(
                    f"{flag} {value} does not divide the world size {w} (every rank must belong to one group of "
                    f"{value}){hint}"
                )
        return Layout(tp, ep, w, placement)

    # ------------------------------------------------------------------ sizes
    @property
    def dp(self) -> int:
        """Attention groups (data-parallel replicas of the attention)."""
        return self.world // self.tp

    @property
    def expert_groups(self) -> int:
        return self.world // self.ep

    @property
    def single(self) -> bool:
        return self.world == 1

    # ------------------------------------------------------------------ a rank's place
    def check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world:
            raise LayoutError(f"rank {rank} is outside the world of {self.world}")

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp

    def dp_index(self, rank: int) -> int:
        """The attention group of ``rank``."""
        return rank // self.tp

    def ep_rank(self, rank: int) -> int:
        return rank % self.ep

    def tp_group(self, rank: int) -> tuple[int, ...]:
        start = self.dp_index(rank) * self.tp
        return tuple(range(start, start + self.tp))

    def ep_group(self, rank: int) -> tuple[int, ...]:
        start = (rank // self.ep) * self.ep
        return tuple(range(start, start + self.ep))

    def tp_groups(self) -> list[tuple[int, ...]]:
        return [tuple(range(g * self.tp, (g + 1) * self.tp)) for g in range(self.dp)]

    def ep_groups(self) -> list[tuple[int, ...]]:
        return [tuple(range(h * self.ep, (h + 1) * self.ep)) for h in range(self.expert_groups)]

    def leader(self, dp_index: int) -> int:
        """The first rank of attention group ``dp_index`` (it returns the group's logits to rank 0)."""
        return dp_index * self.tp

    # ------------------------------------------------------------------ experts
    def placement_for(self, layer: int, num_experts: int) -> ExpertPlacement:
        """Where layer ``layer``'s experts live inside an expert group (physical slots per ep rank)."""
        p = self.placement
        if isinstance(p, dict):
            p = p.get(layer)
        if p is None:
            return ExpertPlacement.even(num_experts, self.ep)
        if p.num_experts != num_experts or p.ranks != self.ep:
            raise LayoutError(
                f"expert placement for layer {layer} covers {p.num_experts} experts on {p.ranks} ranks; the model "
                f"has {num_experts} experts and --ep is {self.ep}"
            )
        return p

    def with_placement(self, placement) -> Layout:
        return Layout(self.tp, self.ep, self.world, placement)

    def describe(self, routed_experts: bool = True) -> str:
        """One line: the attention groups and where the routed experts live (``routed_experts`` False: a model
        without them, whose ep ranks split nothing)."""
        groups = f"{self.dp} attention group{'s' if self.dp > 1 else ''} of {self.tp} rank{'s' if self.tp > 1 else ''}"
        dp = " (data-parallel)" if self.dp > 1 else ""
        experts = f"experts split over {self.ep} rank{'s' if self.ep > 1 else ''}"
        if not routed_experts:
            experts = "no routed experts to split"
        elif self.expert_groups > 1:
            experts += f" ({self.expert_groups} expert groups, each holding every expert)"
        return (
            f"tp {self.tp} x ep {self.ep} on {self.world} rank{'s' if self.world > 1 else ''}: {groups}{dp}; {experts}"
        )


def split_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of part ``index`` when n items are cut into ``parts`` contiguous parts whose sizes
    differ by at most one (the first n % parts parts are one larger)."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)
