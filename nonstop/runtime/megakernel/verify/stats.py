"""Schedule statistics for humans: tasks, counters, waits, weight bytes per task, dependency depth."""

from __future__ import annotations

from collections import defaultdict

from nonstop.runtime.megakernel.tasks import Schedule


def _percentile(sorted_values: list[int], q: int) -> int:
    """Nearest rank: the ceil(q·n / 100)-th smallest of n values (the least, for q = 0)."""
    if not sorted_values:
        return 0
    rank = -(-q * len(sorted_values) // 100)
    return sorted_values[max(rank, 1) - 1]


def schedule_stats(s: Schedule) -> dict:
    """Counts, wait fan-in, weight bytes per task (percentiles), per-kind totals and the depth of the
    counter graph (the longest chain of same-step waits: stages that must run one after another)."""
    waits = [len(t.waits) for t in s.tasks]
    nbytes = sorted(t.weight_bytes for t in s.tasks)
    depth = [0] * len(s.counters)
    for t in s.tasks:  # queue order is topological
        d = 1 + max((depth[w.counter] for w in t.waits if w.base != 0), default=0)
        depth[t.counter] = max(depth[t.counter], d)
    kinds: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for t in s.tasks:
        k = s.ops[t.op].kind
        kinds[k][0] += 1
        kinds[k][1] += t.weight_bytes
    return {
        "tasks": len(s.tasks),
        "ops": len(s.ops),
        "counters": len(s.counters),
        "buffers": len(s.buffers),
        "waits": sum(waits),
        "waits_per_task_max": max(waits, default=0),
        "previous_step_waits": sum(1 for t in s.tasks for w in t.waits if w.base == 0),
        "weight_bytes": sum(nbytes),
        "weight_bytes_percentiles": {q: _percentile(nbytes, q) for q in (0, 10, 50, 90, 99, 100)},
        "tasks_without_weights": sum(1 for b in nbytes if b == 0),
        "depth": max(depth, default=0),
        "kinds": {k: {"tasks": v[0], "weight_bytes": v[1]} for k, v in sorted(kinds.items())},
    }


def format_stats(s: Schedule) -> str:
    st = schedule_stats(s)
    p = st["weight_bytes_percentiles"]
    lines = [
        f"schedule: B={s.B} T={s.T} {'persistent (steps back to back)' if s.persistent else 'one launch per step'}",
        f"tasks {st['tasks']}  ops {st['ops']}  counters {st['counters']}  buffers {st['buffers']}  depth "
        f"{st['depth']} (tasks per level {st['tasks'] / max(st['depth'], 1):.1f})",
        f"waits {st['waits']} (max {st['waits_per_task_max']} per task, {st['previous_step_waits']} on the previous "
        "step)",
        f"weight bytes {st['weight_bytes']:,}; per task p0 {p[0]:,} p10 {p[10]:,} p50 {p[50]:,} p90 {p[90]:,} p99 "
        f"{p[99]:,} max {p[100]:,}; {st['tasks_without_weights']} tasks stream none",
        f"{'kind':<20} {'tasks':>7} {'weight bytes':>16}",
    ]
    lines += [f"{k:<20} {v['tasks']:>7} {v['weight_bytes']:>16,}" for k, v in st["kinds"].items()]
    return "\n".join(lines)


def print_stats(s: Schedule) -> None:
    print(format_stats(s))
