"""Python simulator of the megakernel protocol: W workers, one global ticket counter, monotonic counters.

Each scheduling event moves one worker that can move, chosen by a seeded RNG:
  idle     takes the next ticket q (task q % N of step q // N) — ``prefetch`` would be issued here;
  waiting  starts its task once every wait holds (counter >= step * per_step + base): the task's
           reads happen now (the action's ``start``; the race detector checks them);
  running  finishes: the action's ``finish`` lands its writes, then its counter gets +1.
Many steps run back to back without resetting counters. ``bias`` is the chance of moving the worker
holding the highest ticket instead of a random pick: it drives later tasks ahead of earlier ones,
which is how misordered pairs show up. With ``slow_workers`` some workers move rarely (a slow or
preempted SM), so the tasks they hold fall far behind. ``stall`` names one ticket whose worker moves
only when nothing else can: every task not ordered after it then runs first, so any access that
conflicts with the stalled task and is not ordered after it is caught (``hunt`` stalls each ticket).
When no worker can move before the end, the run is a deadlock and the result names the stuck tasks and
the counters they wait on.

Non-persistent schedules (one launch per step) get a barrier between steps: tickets of step e+1 are
handed out only after every task of step e finished and ``actions.between_steps(e)`` ran (the host).
Checked besides races: a counter must never be incremented outside its step's range
[e * per_step, (e+1) * per_step) (an increment of step e+1 overtaking step e's), and at the end
every counter equals steps * per_step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from nonstop.runtime.megakernel.tasks import Schedule
from nonstop.runtime.megakernel.verify.shadow import Shadow

IDLE, WAITING, RUNNING = 0, 1, 2


class NoActions:
    """Protocol-only runs: tasks do nothing but touch the shadow counts."""

    def start(self, task: int, epoch: int):
        return None

    def finish(self, task: int, epoch: int, pending) -> None:
        pass

    def between_steps(self, epoch: int) -> None:
        pass


@dataclass
class SimResult:
    steps: int
    workers: int
    seed: int
    finished: int = 0
    events: int = 0
    races: list[str] = field(default_factory=list)
    deadlock: str | None = None
    counters: list[int] = field(default_factory=list)
    counter_errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.races and self.deadlock is None and not self.counter_errors

    @property
    def hazard(self) -> bool:
        """A real hazard was observed: a race, a deadlock or a counter overtaken."""
        return not self.ok

    def summary(self) -> str:
        if self.ok:
            return f"ok: {self.finished} tasks, {self.events} events, {self.workers} workers, seed {self.seed}"
        parts = ([f"deadlock: {self.deadlock}"] if self.deadlock else []) + self.races[:3] + self.counter_errors[:3]
        return "; ".join(parts)


@dataclass
class _Worker:
    state: int = IDLE
    ticket: int = -1
    pending: object = None
    blocked: tuple[int, int] | None = None  # (counter, target) of the wait it was last found short of


def simulate(
    s: Schedule,
    steps: int = 3,
    workers: int = 4,
    seed: int = 0,
    actions=None,
    bias: float = 0.0,
    slow_workers: float = 0.0,
    stall: int | None = None,
    stop_on_hazard: bool = True,
    shadow: Shadow | None = None,
) -> SimResult:
    """Run ``steps`` steps of ``s`` with ``workers`` workers in a seeded random interleaving."""
    actions = actions or NoActions()
    shadow = shadow or Shadow(s)
    rng = random.Random(seed)
    N = len(s.tasks)
    total = steps * N
    counters = [0] * len(s.counters)
    pool = [_Worker() for _ in range(workers)]
    speed = {id(w): (rng.choice((0.02, 0.001)) if rng.random() < slow_workers else 1.0) for w in pool}
    result = SimResult(steps, workers, seed)
    next_ticket = 0
    open_until = total if s.persistent else N  # tickets below this may be handed out
    done_in_step = [0] * steps

    def ready(w: _Worker) -> bool:
        if w.state == IDLE:
            return next_ticket < open_until
        if w.state == RUNNING:
            return True
        if w.blocked is not None and counters[w.blocked[0]] < w.blocked[1]:
            return False  # still short of the wait it was last blocked on
        e, i = divmod(w.ticket, N)
        for x in s.tasks[i].waits:
            target = x.target(e)
            if counters[x.counter] < target:
                w.blocked = (x.counter, target)
                return False
        w.blocked = None
        return True

    while result.finished < total:
        movable = [w for w in pool if ready(w)]
        if not movable:
            result.deadlock = _deadlock_report(s, pool, counters, next_ticket, N)
            break
        if stall is not None and len(movable) > 1:
            movable = [w for w in movable if w.ticket != stall] or movable
        if bias and rng.random() < bias:
            w = max(movable, key=lambda w: w.ticket if w.state != IDLE else next_ticket)
        elif slow_workers:
            w = rng.choices(movable, weights=[speed[id(w)] for w in movable])[0]
        else:
            w = rng.choice(movable)
        result.events += 1
        if w.state == IDLE:
            w.state, w.ticket = WAITING, next_ticket
            next_ticket += 1
            continue
        e, i = divmod(w.ticket, N)
        if w.state == WAITING:
            result.races += shadow.on_start(i, e)
            w.pending = actions.start(i, e)
            w.state = RUNNING
        else:
            result.races += shadow.on_finish(i, e)
            actions.finish(i, e, w.pending)
            c = s.tasks[i].counter
            per_step = s.counters[c].per_step
            if not e * per_step <= counters[c] < (e + 1) * per_step:
                result.counter_errors.append(
                    f"step {e}: task {s.task_name(i)} increments {s.counter_name(c)} at {counters[c]}, outside its "
                    f"step's range [{e * per_step}, {(e + 1) * per_step}): increments of different steps overtook "
                    "each other"
                )
            counters[c] += 1
            w.state, w.ticket, w.pending = IDLE, -1, None
            result.finished += 1
            done_in_step[e] += 1
            if not s.persistent and done_in_step[e] == N and e + 1 < steps:
                actions.between_steps(e)
                open_until = (e + 2) * N
        if stop_on_hazard and (result.races or result.counter_errors):
            break
    result.counters = counters
    if result.finished == total:
        for c, counter in enumerate(s.counters):
            if counters[c] != steps * counter.per_step:
                result.counter_errors.append(
                    f"{s.counter_name(c)} ends at {counters[c]}, expected {steps} * {counter.per_step}"
                )
    return result


def _deadlock_report(s: Schedule, pool: list[_Worker], counters: list[int], next_ticket: int, N: int) -> str:
    stuck = []
    for w in pool:
        if w.state != WAITING:
            continue
        e, i = divmod(w.ticket, N)
        unmet = [
            f"{s.counter_name(x.counter)} at {counters[x.counter]} < {x.target(e)}"
            for x in s.tasks[i].waits
            if counters[x.counter] < x.target(e)
        ]
        stuck.append(f"step {e} task {s.task_name(i)} waits on " + ", ".join(unmet))
    return (
        f"no worker can move (next ticket {next_ticket}): "
        + "; ".join(stuck[:6])
        + (f"; ... {len(stuck) - 6} more" if len(stuck) > 6 else "")
    )


def hunt(s: Schedule, steps: int = 3, workers: int = 64, tickets=None, seeds: int = 8) -> SimResult | None:
    """Look for a hazard: one worker alone, then each ticket stalled in turn (default: every ticket of
    the first two steps), then seeded random runs. Returns the first run that shows one, or None."""
    first = simulate(s, steps, 1)
    if first.hazard:
        return first
    N = len(s.tasks)
    for ticket in tickets if tickets is not None else range(min(steps, 2) * N):
        r = simulate(s, steps, workers, seed=ticket, stall=ticket)
        if r.hazard:
            return r
    for seed in range(seeds):
        r = simulate(s, steps, workers, seed=seed, bias=(0.0, 0.5, 0.9)[seed % 3], slow_workers=0.3)
        if r.hazard:
            return r
    return None


def run_sequential(s: Schedule, steps: int, actions) -> None:
    """The reference order: every task of every step in queue order, one at a time."""
    for e in range(steps):
        for i in range(len(s.tasks)):
            actions.finish(i, e, actions.start(i, e))
        if not s.persistent and e + 1 < steps:
            actions.between_steps(e)
