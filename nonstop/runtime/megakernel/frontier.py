"""Per-buffer access frontiers: which earlier accesses a new access must be ordered after.

Sweeping the tasks in queue order, each buffer keeps, for every element, the *frontier* of the
accesses so far: the last write W, the accumulates A since it and the reads Rd since it. A new
access must happen after (see ``tasks.py``):
  READ -> W and A;   WRITE -> W, A and Rd;   ACCUMULATE -> W and Rd.
Then the frontier moves: a read joins Rd, an accumulate joins A, a write replaces all three. Because
happens-before is transitive and every access is checked against the frontier it replaces, checking
only the frontier orders every conflicting pair (induction over the sweep).

Entries are *keys* ``counter * 2 + epoch`` (epoch 0 or 1 of a two-step sweep), not tasks: two tasks
that increment the same counter are ordered after exactly the same tasks, so the frontier is exact
at counter level and adjacent elements with equal entries merge into one segment. That keeps the
sweep near-linear: a GEMV that writes its output in 100 tiles leaves one segment, not 100.

Elements live in an ``IntervalMap`` per buffer (flat index = row * cols + col). Append-only buffers
(attention caches) start each step fresh, since a step's tokens land in new cache rows; the previous
step's frontier is kept for ``READ_PAST``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator

from nonstop.runtime.megakernel.tasks import Access, Region

EMPTY = (None, frozenset(), frozenset())  # (last write key | None, accumulate keys, read keys)

# which frontier parts an access must follow: (W, A, Rd)
NEEDS = {
    Access.READ: (True, True, False),
    Access.WRITE: (True, True, True),
    Access.ACCUMULATE: (True, False, True),
}


def key_of(counter: int, epoch: int) -> int:
    return counter * 2 + epoch


def counter_of(key: int) -> int:
    return key >> 1


def epoch_of(key: int) -> int:
    return key & 1


class IntervalMap:
    """A piecewise-constant value over ``[0, size)``: segment i is ``[starts[i], starts[i+1])``."""

    def __init__(self, size: int, value):
        self.size = size
        self.starts = [0]
        self.vals = [value]

    def _cut(self, x: int) -> int:
        """Index of the segment that starts at ``x`` (splitting one if needed); len(starts) at the end."""
        if x >= self.size:
            return len(self.starts)
        i = bisect_right(self.starts, x) - 1
        if self.starts[i] != x:
            i += 1
            self.starts.insert(i, x)
            self.vals.insert(i, self.vals[i - 1])
        return i

    def items(self, lo: int, hi: int) -> Iterator[tuple[int, int, object]]:
        """(a, b, value) for each segment overlapping [lo, hi), clipped to it."""
        starts, vals = self.starts, self.vals
        i = bisect_right(starts, lo) - 1
        n = len(starts)
        while i < n and starts[i] < hi:
            end = starts[i + 1] if i + 1 < n else self.size
            yield max(starts[i], lo), min(end, hi), vals[i]
            i += 1

    def update(self, lo: int, hi: int, fn: Callable) -> None:
        """value <- fn(value) on [lo, hi); neighbouring equal segments merge."""
        i, j = self._cut(lo), self._cut(hi)
        for k in range(i, j):
            self.vals[k] = fn(self.vals[k])
        for k in range(min(j, len(self.starts) - 1), max(i, 1) - 1, -1):
            if self.vals[k] == self.vals[k - 1]:
                del self.starts[k], self.vals[k]

    def __len__(self) -> int:
        return len(self.starts)


class Frontier:
    """The access frontier of every buffer during a queue-order sweep over one or two steps."""

    def __init__(self, sizes: list[int], cols: list[int], append_only: list[bool]):
        self.cols = cols
        self.sizes = sizes
        self.append_only = append_only
        self.maps = [IntervalMap(n, EMPTY) for n in sizes]
        self.past: list[IntervalMap | None] = [None] * len(sizes)

    def next_step(self) -> None:
        """Move to the second step: append-only buffers start fresh, their old frontier becomes the past."""
        for b, fresh in enumerate(self.append_only):
            if fresh:
                self.past[b] = self.maps[b]
                self.maps[b] = IntervalMap(self.sizes[b], EMPTY)

    def flatten(self, regions: tuple[Region, ...]) -> list[tuple[Region, list[tuple[int, int]]]]:
        """Each region with its flat element ranges (computed once per task, reused by both calls)."""
        return [(r, r.intervals(self.cols[r.buffer])) for r in regions]

    def required(self, accesses: list) -> dict[int, tuple[Region, int, int, Access]]:
        """Keys that one task's ``accesses`` (from ``flatten``) must follow, each with a witness
        (the region, element range and the earlier access kind)."""
        out: dict[int, tuple[Region, int, int, Access]] = {}
        for reg, intervals in accesses:
            if reg.access == Access.READ_PAST:
                past = self.past[reg.buffer]
                if past is None:
                    continue  # first step: older rows came from the host (prefill)
                for lo, hi in intervals:
                    for a, b, (w, acc, _) in past.items(lo, hi):
                        if w is not None and w not in out:
                            out[w] = (reg, a, b, Access.WRITE)
                        for k in acc:
                            out.setdefault(k, (reg, a, b, Access.ACCUMULATE))
                continue
            need_w, need_a, need_r = NEEDS[reg.access]
            fmap = self.maps[reg.buffer]
            for lo, hi in intervals:
                for a, b, (w, acc, rd) in fmap.items(lo, hi):
                    if need_w and w is not None and w not in out:
                        out[w] = (reg, a, b, Access.WRITE)
                    if need_a:
                        for k in acc:
                            out.setdefault(k, (reg, a, b, Access.ACCUMULATE))
                    if need_r:
                        for k in rd:
                            out.setdefault(k, (reg, a, b, Access.READ))
        return out

    def apply(self, accesses: list, key: int) -> None:
        """Record one task's accesses (reads, then accumulates, then writes) under ``key``."""
        for kind in (Access.READ, Access.ACCUMULATE, Access.WRITE):
            for reg, intervals in accesses:
                if reg.access == kind:
                    fmap = self.maps[reg.buffer]
                    move = _MOVES[kind](key)
                    for lo, hi in intervals:
                        fmap.update(lo, hi, move)


def _after_read(key):
    def move(s):
        return s if key in s[2] else (s[0], s[1], s[2] | {key})

    return move


def _after_accumulate(key):
    def move(s):
        return s if key in s[1] else (s[0], s[1] | {key}, s[2])

    return move


def _after_write(key):
    state = (key, frozenset(), frozenset())
    return lambda s: state


_MOVES = {Access.READ: _after_read, Access.ACCUMULATE: _after_accumulate, Access.WRITE: _after_write}
