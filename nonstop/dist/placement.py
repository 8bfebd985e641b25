"""Expert placement: logical experts -> physical expert slots on the ranks of one expert group.

``slots[r]`` lists the logical experts rank r holds, in its local (physical) order. A logical expert
may live on several ranks (redundant replicas of hot experts); every expert lives somewhere; ranks may
hold different numbers of experts (uneven placement).

A routed (token, expert e) pair from source rank s goes to a replica of e: the one on s itself when s
holds e (no bytes on the wire), else replica number (s + pair index) mod (replicas of e), so the
pairs of one rank spread over the replicas. Which replica computes never changes the result (same
weights).

``rebalanced(load, ranks, redundant)`` follows the published EPLB idea (DeepSeek's expert-parallel load
balancer), re-derived here: give the ``redundant`` extra replicas one at a time to the expert with the
highest load per replica, then place replicas, heaviest first, on the least-loaded rank that still has
a free slot and does not hold that expert yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch


@dataclass(frozen=True)
class ExpertPlacement:
    num_experts: int
    slots: tuple[tuple[int, ...], ...]  # slots[rank] = logical expert ids held by that rank

    def __post_init__(self):
        held = {e for s in self.slots for e in s}
        missing = sorted(set(range(self.num_experts)) - held)
        if missing:
            raise ValueError(f"expert placement leaves expert(s) {missing[:8]} on no rank")
        bad = sorted(held - set(range(self.num_experts)))
        if bad:
            raise ValueError(f"expert placement names expert(s) {bad[:8]} outside 0..{self.num_experts - 1}")

    # ------------------------------------------------------------------ constructors
    @staticmethod
    def even(num_experts: int, ranks: int) -> ExpertPlacement:
        """Contiguous blocks, sizes differing by at most one (the first E % ranks ranks hold one more).
        One object per (E, ranks): every layer and parameter of a model asks for the same one."""
        return _even_placement(num_experts, ranks)

    @staticmethod
    def rebalanced(load, ranks: int, redundant: int = 0) -> ExpertPlacement:
        """A placement balancing ``load`` [E] (tokens routed to each expert, e.g. recorded by the engine)
        over ``ranks`` ranks with ``redundant`` extra replicas (at most one replica of an expert per rank)."""
        load = [float(x) for x in (load.tolist() if isinstance(load, torch.Tensor) else load)]
        E = len(load)
        if redundant < 0 or E + redundant > E * ranks:
            raise ValueError(f"redundant experts must be in 0..{E * ranks - E}, got {redundant}")
        copies = [1] * E
        for _ in range(redundant):
            e = max((e for e in range(E) if copies[e] < ranks), key=lambda e: (load[e] / copies[e], -e))
            copies[e] += 1
        per_rank = -(-(E + redundant) // ranks)
        items = sorted(
            ((load[e] / copies[e], e) for e in range(E) for _ in range(copies[e])), key=lambda t: (-t[0], t[1])
        )
        held: list[list[int]] = [[] for _ in range(ranks)]
        total = [0.0] * ranks
        for share, e in items:
            free = [r for r in range(ranks) if len(held[r]) < per_rank]
            fresh = [r for r in free if e not in held[r]] or free
            r = min(fresh, key=lambda r: (total[r], len(held[r]), r))
            held[r].append(e)
            total[r] += share
        return ExpertPlacement(E, tuple(tuple(sorted(h)) for h in held))

    # ------------------------------------------------------------------ facts
    @property
    def ranks(self) -> int:
        return len(self.slots)

    @cached_property
    def physical(self) -> int:
        return sum(len(s) for s in self.slots)

    @cached_property
    def max_local(self) -> int:
        return max(len(s) for s in self.slots)

    def local(self, rank: int) -> tuple[int, ...]:
        return self.slots[rank]

    def replicas(self, expert: int) -> list[tuple[int, int]]:
        """(rank, local index) of every replica of ``expert``."""
        return [(r, i) for r, s in enumerate(self.slots) for i, e in enumerate(s) if e == expert]

    def local_fraction(self, rank: int) -> float:
        """Share of uniformly routed pairs from ``rank`` that stay on it (it holds the expert)."""
        return len(set(self.slots[rank])) / self.num_experts

    def describe(self) -> str:
        counts = [len(s) for s in self.slots]
        extra = self.physical - self.num_experts
        ranks = f"{self.ranks} rank" + ("s" if self.ranks > 1 else "")
        return f"{self.num_experts} experts on {ranks} ({min(counts)}-{max(counts)} per rank" + (
            f", {extra} redundant)" if extra else ")"
        )

    # ------------------------------------------------------------------ routing (vectorised)
    @cached_property
    def _tables(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """count [E], rank [E, M], local [E, M] of each expert's replicas; where [ranks, E] (local index of
        expert e on rank r, -1 if absent)."""
        E, M = self.num_experts, max(len(self.replicas(e)) for e in range(self.num_experts))
        count = torch.zeros(E, dtype=torch.long)
        rank = torch.zeros(E, M, dtype=torch.long)
        local = torch.zeros(E, M, dtype=torch.long)
        where = torch.full((self.ranks, E), -1, dtype=torch.long)
        for r, s in enumerate(self.slots):
            for i, e in enumerate(s):
                rank[e, count[e]] = r
                local[e, count[e]] = i
                count[e] += 1
                if where[r, e] < 0:
                    where[r, e] = i
        return count, rank, local, where

    def tables_on(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``_tables`` on ``device`` (copied there once: routing on the device reads nothing back)."""
        device = torch.device(device)
        if device.type == "cpu":
            return self._tables
        cache = self.__dict__.setdefault("_tables_on", {})
        if device not in cache:
            cache[device] = tuple(t.to(device) for t in self._tables)
        return cache[device]

    def route(self, experts: torch.Tensor, source: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Logical expert ids [n] of the pairs of rank ``source`` -> (destination rank [n], local slot
        index on it [n]) (long tensors on the device of ``experts``; no host synchronisation)."""
        count, rank, local, where = self.tables_on(experts.device)
        e = experts.long()
        mine = where[source, e]
        pick = (source + torch.arange(e.shape[0], device=e.device)) % count[e]
        dest = torch.where(mine >= 0, torch.full_like(e, source), rank[e, pick])
        slot = torch.where(mine >= 0, mine, local[e, pick])
        return dest, slot


@lru_cache(maxsize=64)
def _even_placement(num_experts: int, ranks: int) -> ExpertPlacement:
    base, extra = divmod(num_experts, ranks)
    slots, start = [], 0
    for r in range(ranks):
        n = base + (1 if r < extra else 0)
        slots.append(tuple(range(start, start + n)))
        start += n
    return ExpertPlacement(num_experts, tuple(slots))
