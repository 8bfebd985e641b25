"""Synthetic task actions over numpy buffers, for testing the protocol apart from any model.

Each task computes a value from what it reads, ``v = (seed(task, step) + Σ_reads Σ_k (k+1)·x_k) mod P``
(position-weighted, so reading the wrong version of any element changes v), and at finish writes
``(k+1)·v + 7 mod P`` into its WRITE regions and adds v into its ACCUMULATE regions (addition mod P
commutes, like fp32 atomics up to rounding). Append-only buffers keep one array per step; READ_PAST
reads the previous step's (zeros before step 0). Two runs of the same schedule agree on every task's v
and every buffer iff every read saw the value the sequential order gives it.
"""

from __future__ import annotations

import numpy as np

from nonstop.runtime.megakernel.tasks import Access, Schedule
from nonstop.runtime.megakernel.verify.shadow import region_index

P = 2_147_483_647


class ChecksumActions:
    def __init__(self, s: Schedule):
        self.s = s
        self.index = [[region_index(r, s.buffers[r.buffer].cols) for r in t.regions] for t in s.tasks]
        self.buffers = {}
        self.values: dict[tuple[int, int], int] = {}

    def _array(self, b: int, epoch: int) -> np.ndarray:
        slot = (b, epoch if self.s.buffers[b].append_only else -1)
        if slot not in self.buffers:
            self.buffers[slot] = np.zeros(self.s.buffers[b].size, np.int64)
        return self.buffers[slot]

    def start(self, i: int, epoch: int) -> int:
        v = (i * 1_000_003 + epoch * 7919 + 1) % P
        for r, idx in zip(self.s.tasks[i].regions, self.index[i]):
            if r.access == Access.READ:
                x = self._array(r.buffer, epoch)[idx]
            elif r.access == Access.READ_PAST:
                x = self._array(r.buffer, epoch - 1)[idx]
            else:
                continue
            v = (v + int(((x * (np.arange(len(idx)) + 1)) % P).sum())) % P
        return v

    def finish(self, i: int, epoch: int, v: int) -> None:
        self.values[(i, epoch)] = v
        for r, idx in zip(self.s.tasks[i].regions, self.index[i]):
            arr = self._array(r.buffer, epoch)
            if r.access == Access.WRITE:
                arr[idx] = ((np.arange(len(idx)) + 1) * v + 7) % P
            elif r.access == Access.ACCUMULATE:
                arr[idx] = (arr[idx] + v) % P

    def between_steps(self, epoch: int) -> None:
        pass

    def snapshot(self) -> dict:
        return {k: v.copy() for k, v in self.buffers.items()}
