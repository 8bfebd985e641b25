"""A toy timing model of one step of a schedule on W workers, to compare schedules before a kernel exists.

Tickets go in queue order to the worker that frees up first. A worker streams its task's weights at
``bandwidth / workers`` from the moment it takes the ticket (``prefetch``: weights depend on no
activation; slices chosen at run time — routed experts — start only after the waits), its waits are
met ``wait_latency`` after the last producer of each waited counter finished, and the tile's work
ends ``overhead`` after both. Not a GPU model (no shared-bandwidth rebalancing, no caches, no compute
time): it shows where the dependency structure idles bandwidth, e.g. per-op barriers versus
per-buffer counters, or waiting before loading (MPK v1) versus prefetching (Hazy).
"""

from __future__ import annotations

import heapq

from nonstop.runtime.megakernel.schedule import Schedule


def estimate_step(s: Schedule, workers: int = 132, bandwidth: float = 3.0e12, overhead: float = 1e-6, wait_latency: float = 0.5e-6, prefetch: bool = True) -> dict:
    """{"seconds", "floor" (all weight bytes at ``bandwidth``), "efficiency" = floor / seconds}."""
    per_worker = bandwidth / workers
    done = [0.0] * len(s.counters)  # when the counter's last task of the step finished
    free = [(0.0, w) for w in range(workers)]
    end = 0.0
    for t in s.tasks:
        start, w = heapq.heappop(free)
        ready = max((done[x.counter] + wait_latency for x in t.waits if x.base != 0), default=start)
        fixed = sum(x.nbytes for x in t.weights if not x.dynamic) / per_worker
        routed = sum(x.nbytes for x in t.weights if x.dynamic) / per_worker
        if prefetch:
            begin = max(start + fixed, ready) + routed
        else:
            begin = max(start, ready) + fixed + routed
        finish = begin + overhead
        done[t.counter] = max(done[t.counter], finish)
        end = max(end, finish)
        heapq.heappush(free, (finish, w))
    floor = sum(t.weight_bytes for t in s.tasks) / bandwidth
    return {"seconds": end, "floor": floor, "efficiency": floor / end if end else 1.0}
