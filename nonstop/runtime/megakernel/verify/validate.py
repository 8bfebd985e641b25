"""Static validator: prove a Schedule safe before launch, or name the task and buffer that make it unsafe.

Model. Workers are arbitrary: nothing orders two tasks except counter waits (same-worker program
order is not assumed). Task (t, e) — task t of step e — happens after every task whose counter it
waits on (for the step the target selects) and, transitively, after their predecessors. Rules, in
the order checked (each raises ``ScheduleError``):

1. structure   indices in range, regions inside their buffers, each counter's recorded
               ``per_step`` equal to the number of tasks that increment it.
2. waits       the counter is incremented by some task; the wait's epoch scaling equals the
               counter's per-step increment (else it is wrong from step 1 on); the target base is
               ``per_step`` (this step) or 0 (previous step) — anything larger can never be met in
               its step, anything in between releases the waiter before all producers finished.
3. acyclic     the counter graph of same-step waits has no cycle (a witness cycle is reported).
4. queue order a task waits only on counters whose tasks all come earlier in the queue: tickets are
               handed out in order and a worker blocks on its task, so waiting on a later task can
               deadlock (certainly with one worker).
5. races       every conflicting pair of accesses (read/write, write/write, accumulate/read or write)
               to overlapping elements is ordered, within a step and (persistent) between step e and
               e+1 — later steps then follow by rule 6.
6. epochs      (persistent) every task of step e+1 follows all of step e's increments of its own
               counter, so a step-e waiter can never be released by step-(e+1) increments (and each
               task's instances are chained step after step).

Complexity. Rules 1-4 and 6: O(tasks + waits + counters). Ancestor sets are bitsets over counters (one per
counter and step offset), so "is counter c's step-e work before task t" is one bit test and the
closure costs O(waits x counters / 64) word operations. Rule 5 sweeps the tasks twice in queue order
over per-buffer interval maps whose entries are counters (``frontier.py``); each access costs
O(log s + segments it overlaps). No task-pair closure is ever formed.
"""

from __future__ import annotations

from nonstop.runtime.megakernel.frontier import Frontier, counter_of, epoch_of, key_of
from nonstop.runtime.megakernel.tasks import VERB, Access, Schedule, ScheduleError, describe_elements

__all__ = ["ScheduleError", "validate"]


def validate(s: Schedule) -> None:
    """Raise ``ScheduleError`` if ``s`` can race, deadlock or release a waiter early; else return None."""
    owners = s.tasks_of_counter() if _counters_in_range(s) else None
    _check_structure(s, owners)
    _check_waits(s, owners)
    _check_acyclic(s, owners)
    _check_queue_order(s, owners)
    anc0, anc1 = _ancestors(s)
    _check_races(s, owners, anc0, anc1)
    _check_epochs(s, anc0, anc1)


# ----------------------------------------------------------------------------- rules 1-4


def _counters_in_range(s: Schedule) -> bool:
    C = len(s.counters)
    for i, t in enumerate(s.tasks):
        if not 0 <= t.counter < C:
            raise ScheduleError(
                f"task {s.task_name(i)} increments counter {t.counter}, but the schedule has {C} counters"
            )
    return True


def _check_structure(s: Schedule, owners) -> None:
    for i, t in enumerate(s.tasks):
        for r in t.regions:
            if not 0 <= r.buffer < len(s.buffers):
                raise ScheduleError(
                    f"task {s.task_name(i)} touches buffer {r.buffer}, but the schedule has {len(s.buffers)} buffers"
                )
            b = s.buffers[r.buffer]
            if not (0 <= r.r0 < r.r1 <= b.rows and 0 <= r.c0 < r.c1 <= b.cols):
                raise ScheduleError(
                    f"task {s.task_name(i)} {VERB[r.access]} {r.describe(b.name)}, outside (or an empty part of) "
                    f"{b.name} [{b.rows}, {b.cols}]"
                )
            if r.access == Access.READ_PAST and not b.append_only:
                raise ScheduleError(
                    f"task {s.task_name(i)} reads earlier steps' rows of {b.name}, which is not an append-only buffer"
                )
    for c, (counter, tasks) in enumerate(zip(s.counters, owners)):
        if tasks and counter.per_step != len(tasks):
            raise ScheduleError(
                f"{s.counter_name(c)} records per_step {counter.per_step} but {len(tasks)} tasks increment it (first "
                f"{s.task_name(tasks[0])})"
            )


def _check_waits(s: Schedule, owners) -> None:
    for i, t in enumerate(s.tasks):
        for w in t.waits:
            who = f"task {s.task_name(i)}"
            if not 0 <= w.counter < len(s.counters) or not owners[w.counter]:
                raise ScheduleError(
                    f"{who} waits on {s.counter_name(w.counter)}, which no task increments: the wait can never be "
                    "satisfied"
                )
            grows = len(owners[w.counter])
            what = s.counter_name(w.counter)
            if w.per_step != grows:
                raise ScheduleError(
                    f"{who} waits on {what} with target e*{w.per_step}+{w.base}, but {what} grows by {grows} per "
                    "step: wrong epoch scaling (from step 1 on it waits for the wrong increments)"
                )
            if w.base > grows:
                raise ScheduleError(
                    f"{who} waits on {what} for {w.base} increments, but only {grows} tasks increment it per step: "
                    "the wait can never be satisfied within its step"
                )
            if w.base not in (0, grows):
                raise ScheduleError(
                    f"{who} waits on {what} with target base {w.base}: must be {grows} (all of this step's "
                    f"increments) or 0 (all of the previous step's); {w.base} releases it before every producer "
                    "finished"
                )


def _check_acyclic(s: Schedule, owners) -> None:
    """Counter graph: edge p -> c when a task of c waits (this step) on p."""
    C = len(s.counters)
    succ: list[set[int]] = [set() for _ in range(C)]
    for t in s.tasks:
        for w in t.waits:
            if w.base != 0:
                succ[w.counter].add(t.counter)
    color = [0] * C  # 0 new, 1 on the stack, 2 done
    for root in range(C):
        if color[root]:
            continue
        stack = [(root, iter(sorted(succ[root])))]
        path = [root]
        color[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = 2
                stack.pop()
                path.pop()
            elif color[nxt] == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                raise ScheduleError(
                    "cycle of waits (deadlock in every interleaving): " + _cycle_witness(s, owners, cycle)
                )
            elif color[nxt] == 0:
                color[nxt] = 1
                stack.append((nxt, iter(sorted(succ[nxt]))))
                path.append(nxt)


def _cycle_witness(s: Schedule, owners, cycle: list[int]) -> str:
    steps = []
    for p, c in zip(cycle, cycle[1:]):
        waiter = next(i for i in owners[c] if any(w.counter == p and w.base != 0 for w in s.tasks[i].waits))
        steps.append(
            f"task {s.task_name(waiter)} waits on {s.counter_name(p)} (incremented by task {s.task_name(owners[p][0])})"
        )
    return "; ".join(steps)


def _check_queue_order(s: Schedule, owners) -> None:
    for i, t in enumerate(s.tasks):
        for w in t.waits:
            if w.base != 0 and owners[w.counter][-1] > i:
                later = owners[w.counter][-1]
                raise ScheduleError(
                    f"task {s.task_name(i)} waits on {s.counter_name(w.counter)}, which task {s.task_name(later)} "
                    "increments later in the queue: a worker blocked on it may hold the ticket order (deadlock with "
                    "few workers); tasks must wait only on earlier tasks"
                )


# ----------------------------------------------------------------------------- ancestors, rule 6


def _task_ancestors(t, anc0: list[int], anc1: list[int]) -> tuple[int, int]:
    """(counters whose same-step work precedes the task, ... whose previous-step work does)."""
    a0 = a1 = 0
    for w in t.waits:
        if w.base == 0:
            a1 |= (1 << w.counter) | anc0[w.counter]
        else:
            a0 |= (1 << w.counter) | anc0[w.counter]
            a1 |= anc1[w.counter]
    return a0, a1


def _ancestors(s: Schedule) -> tuple[list[int], list[int]]:
    C = len(s.counters)
    anc0, anc1 = [0] * C, [0] * C
    for t in s.tasks:  # same-step ancestors: waited counters' tasks all precede (rule 4)
        a0 = 0
        for w in t.waits:
            if w.base != 0:
                a0 |= (1 << w.counter) | anc0[w.counter]
        anc0[t.counter] |= a0
    if s.persistent:
        for t in s.tasks:
            anc1[t.counter] |= _task_ancestors(t, anc0, anc1)[1]
    return anc0, anc1


def _check_epochs(s: Schedule, anc0: list[int], anc1: list[int]) -> None:
    if not s.persistent:
        return
    for i, t in enumerate(s.tasks):
        if not (_task_ancestors(t, anc0, anc1)[1] >> t.counter) & 1:
            raise ScheduleError(
                f"task {s.task_name(i)} of step e+1 is not ordered after all of step e's increments of its own "
                f"{s.counter_name(t.counter)}: "
                "its increment could land first and release a step-e waiter before step e's producers finished (add "
                "a wait on the counter with base 0)"
            )


# ----------------------------------------------------------------------------- rule 5: races


def _check_races(s: Schedule, owners, anc0: list[int], anc1: list[int]) -> None:
    frontier = Frontier([b.size for b in s.buffers], [b.cols for b in s.buffers], [b.append_only for b in s.buffers])
    flat = [frontier.flatten(t.regions) for t in s.tasks]
    for step in (0, 1) if s.persistent else (0,):
        if step:
            frontier.next_step()
        for i, t in enumerate(s.tasks):
            a0, a1 = _task_ancestors(t, anc0, anc1)
            for key, witness in frontier.required(flat[i]).items():
                c = counter_of(key)
                same = epoch_of(key) == step
                if ((a0 if same else a1) >> c) & 1:
                    continue
                raise ScheduleError(_race_message(s, owners, i, c, same, witness))
            frontier.apply(flat[i], key_of(t.counter, step))


def _race_message(s: Schedule, owners, i: int, c: int, same_step: bool, witness) -> str:
    region, lo, hi, their = witness
    buf = s.buffers[region.buffer]
    where = describe_elements(buf.name, buf.cols, lo, hi)
    other = _find_accessor(s, owners[c], region, lo, hi, their, exclude=i if same_step else None)
    step = "" if same_step else " in the previous step"
    mine = s.tasks[i]
    if same_step and c == mine.counter:
        return (
            f"unordered {_kind(region.access, their)} on {where}: task {s.task_name(i)} {VERB[region.access]} it and "
            f"task {s.task_name(other)} "
            f"{VERB[their]} it, but both increment {s.counter_name(c)}, so neither can wait for the other"
        )
    return (
        f"{_kind(region.access, their)} race on {where}: task {s.task_name(i)} {VERB[region.access]} it, but task "
        f"{s.task_name(other)}, which "
        f"{VERB[their]} it{step}, is not ordered before it (no chain of waits leads from {s.counter_name(c)} to the "
        "task)"
    )


def _kind(mine: Access, theirs: Access) -> str:
    if Access.ACCUMULATE in (mine, theirs) and Access.WRITE in (mine, theirs):
        return "write/accumulate"
    if mine == Access.WRITE and theirs == Access.WRITE:
        return "write/write"
    if theirs == Access.READ:
        return "write-after-read"
    return "read-after-write"


def _find_accessor(s: Schedule, tasks: list[int], region, lo: int, hi: int, access: Access, exclude) -> int:
    """A task of the list whose ``access`` of the buffer overlaps the elements [lo, hi)."""
    cols = s.buffers[region.buffer].cols
    for j in tasks:
        if j == exclude:
            continue
        for r in s.tasks[j].regions:
            if (
                r.buffer == region.buffer
                and r.access == access
                and any(a < hi and lo < b for a, b in r.intervals(cols))
            ):
                return j
    return tasks[0]
