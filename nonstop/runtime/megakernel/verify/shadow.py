"""Dynamic race detector: shadow counts per buffer element, checked against a sequential replay.

Every element carries two counts: ``mods`` (writes + accumulates applied) and ``reads`` (reads that
finished). Replaying one step in queue order gives, for each access of each task, the counts that the
sequential execution would show when that access happens; step e adds e times the per-step growth.
In a concurrent run an access that comes *later* in the sequential order than a conflicting one
but happens *earlier* sees a count below its expectation, so it suffices to check lower bounds:

  READ        at task start:  mods >= expected mods (its writers finished).
  WRITE       at task finish: mods >= expected and reads >= expected (earlier readers finished).
  ACCUMULATE  at task finish: mods >= the count before its group of commuting accumulates and
              reads >= expected.
  READ_PAST   at task start:  the previous step's writes of the rows are all done.
Reads count when their task *finishes*, so a write that lands while a reader is still running is
caught. Append-only buffers (attention caches) get fresh counts each step: a step's tokens are new rows.
"""

from __future__ import annotations

import numpy as np

from nonstop.runtime.megakernel.tasks import Access, Schedule, describe_elements


def region_index(region, cols: int) -> np.ndarray:
    """Flat element indices of a region."""
    return np.concatenate([np.arange(lo, hi) for lo, hi in region.intervals(cols)])


class Shadow:
    def __init__(self, s: Schedule):
        self.s = s
        sizes = [b.size for b in s.buffers]
        self.index = [[region_index(r, s.buffers[r.buffer].cols) for r in t.regions] for t in s.tasks]
        mods = [np.zeros(n, np.int64) for n in sizes]
        reads = [np.zeros(n, np.int64) for n in sizes]
        in_group = [np.zeros(n, bool) for n in sizes]  # last modification was an accumulate
        group_start = [np.zeros(n, np.int64) for n in sizes]
        self.expect: list[list[tuple[np.ndarray, np.ndarray | None]]] = []
        for t, idxs in zip(s.tasks, self.index):
            exp = [None] * len(t.regions)
            for kind in (Access.READ, Access.READ_PAST, Access.ACCUMULATE, Access.WRITE):
                if kind == Access.READ_PAST:  # the task's reads count before its own writes are checked
                    for r, idx in zip(t.regions, idxs):
                        if r.access == Access.READ:
                            reads[r.buffer][idx] += 1
                for k, (r, idx) in enumerate(zip(t.regions, idxs)):
                    if r.access != kind:
                        continue
                    b = r.buffer
                    if kind == Access.READ:
                        exp[k] = (mods[b][idx].copy(), None)
                    elif kind == Access.READ_PAST:
                        exp[k] = (None, None)
                    elif kind == Access.ACCUMULATE:
                        start = np.where(in_group[b][idx], group_start[b][idx], mods[b][idx])
                        group_start[b][idx] = start
                        exp[k] = (start, reads[b][idx].copy())
                    else:
                        exp[k] = (mods[b][idx].copy(), reads[b][idx].copy())
                    if kind == Access.ACCUMULATE or kind == Access.WRITE:
                        mods[b][idx] += 1
                        in_group[b][idx] = kind == Access.ACCUMULATE
                    elif kind == Access.READ:
                        in_group[b][idx] = False
            self.expect.append(exp)
        self.step_mods, self.step_reads = mods, reads  # per-step growth
        self.mods = {}  # (buffer, step or -1) -> counts
        self.reads = {}

    def _counts(self, b: int, epoch: int):
        slot = (b, epoch if self.s.buffers[b].append_only else -1)
        if slot not in self.mods:
            n = self.s.buffers[b].size
            self.mods[slot] = np.zeros(n, np.int64)
            self.reads[slot] = np.zeros(n, np.int64)
        return self.mods[slot], self.reads[slot]

    def _scale(self, b: int, epoch: int) -> int:
        return 0 if self.s.buffers[b].append_only else epoch

    def on_start(self, i: int, epoch: int) -> list[str]:
        """Check the task's reads as it starts; returns race descriptions."""
        t = self.s.tasks[i]
        out = []
        for r, idx, exp in zip(t.regions, self.index[i], self.expect[i]):
            b = r.buffer
            if r.access == Access.READ:
                mods, _ = self._counts(b, epoch)
                want = exp[0] + self._scale(b, epoch) * self.step_mods[b][idx]
                self._report(
                    out,
                    i,
                    epoch,
                    r,
                    idx,
                    mods[idx] < want,
                    "read it before a write of it (earlier in the queue) finished",
                )
            elif r.access == Access.READ_PAST and epoch > 0:
                mods, _ = self._counts(b, epoch - 1)
                self._report(
                    out,
                    i,
                    epoch,
                    r,
                    idx,
                    mods[idx] < self.step_mods[b][idx],
                    "read previous steps' rows before the previous step's write of them finished",
                )
        return out

    def on_finish(self, i: int, epoch: int) -> list[str]:
        """Count the task's reads, check and apply its writes and accumulates; returns race descriptions."""
        t = self.s.tasks[i]
        out = []
        for r, idx in zip(t.regions, self.index[i]):
            if r.access == Access.READ:
                self._counts(r.buffer, epoch)[1][idx] += 1
        for kind in (Access.ACCUMULATE, Access.WRITE):
            for r, idx, exp in zip(t.regions, self.index[i], self.expect[i]):
                if r.access != kind:
                    continue
                b = r.buffer
                mods, reads = self._counts(b, epoch)
                scale = self._scale(b, epoch)
                early_mod = mods[idx] < exp[0] + scale * self.step_mods[b][idx]
                early_read = reads[idx] < exp[1] + scale * self.step_reads[b][idx]
                self._report(out, i, epoch, r, idx, early_mod, "modified it before an earlier write of it finished")
                self._report(out, i, epoch, r, idx, early_read, "modified it before an earlier reader of it finished")
                mods[idx] += 1
        return out

    def _report(self, out: list[str], i: int, epoch: int, region, idx: np.ndarray, bad: np.ndarray, what: str) -> None:
        if not bad.any():
            return
        b = self.s.buffers[region.buffer]
        first = int(idx[np.argmax(bad)])
        out.append(
            f"step {epoch}: task {self.s.task_name(i)} {what}: {describe_elements(b.name, b.cols, first, first + 1)}"
        )
