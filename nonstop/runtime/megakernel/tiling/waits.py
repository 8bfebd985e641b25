"""Counters and waits of a tiled step, derived from the regions its tasks declare.

``assemble(buffers, ops, persistent, B, T)`` puts the tasks in op / stage / tile order and gives them
counters (one per (op, stage), or with ``split_counters`` one per set of buffers a stage's tiles write,
so a consumer waits only for the tiles that produce what it reads) and the fewest waits that order
every read after the writes it must see, every write after the reads and writes it must follow, and
accumulates (which commute) after writes and reads - with the same frontier rules the validator checks
(``frontier.py``). Persistent schedules also order step e+1's accesses after step e's.
"""

from __future__ import annotations

from nonstop.runtime.megakernel.frontier import Frontier, counter_of, epoch_of, key_of
from nonstop.runtime.megakernel.tasks import (
    Access,
    BufferInfo,
    Counter,
    OpTiles,
    Region,
    Schedule,
    ScheduleError,
    Task,
    TileSpec,
    Wait,
)


def assemble(
    buffers: list[BufferInfo],
    ops: list[OpTiles],
    persistent: bool,
    B: int = 1,
    T: int = 1,
    opcodes: list[tuple[str, str]] | None = None,
    split_counters: bool = False,
) -> Schedule:
    """Tasks in op / stage / tile order, counters, and the fewest waits that order every conflicting
    access (derived with the same frontier rules the validator checks).

    One counter per (op, stage); with ``split_counters`` one per (op, stage, set of buffers a tile
    writes), so a consumer waits only for the tiles that produce what it reads: e.g. moe_experts then
    waits for moe_front's router and latent tiles but not its shared-expert tiles, and mla_q_up not for
    mla_in_proj's gate tiles. ``opcodes``: the kernel's dispatch table of (kind, stage name); by default
    the pairs in order of first appearance."""
    table = list(opcodes) if opcodes is not None else []
    counters: list[Counter] = []
    stage_of: list[tuple[int, int]] = []  # (op, stage) of each counter
    raw: list[tuple[int, int, TileSpec, int]] = []
    for oi, op in enumerate(ops):
        for si, stage in enumerate(op.stages):
            if not stage.tiles:
                continue
            pair = (op.kind, stage.name)
            if pair not in table:
                if opcodes is not None:
                    raise ScheduleError(f"{op.name}: no opcode for kind {op.kind!r} stage {stage.name!r}")
                table.append(pair)
            groups: dict[tuple, int] = {}
            for spec in stage.tiles:
                written = (
                    tuple(sorted({r.buffer for r in spec.regions if r.access in (Access.WRITE, Access.ACCUMULATE)}))
                    if split_counters
                    else ()
                )
                if written not in groups:
                    groups[written] = len(counters)
                    suffix = ":" + "+".join(buffers[b].name for b in written) if split_counters else ""
                    counters.append(Counter(f"{op.name}/{stage.name}{suffix}", 0))
                    stage_of.append((oi, si))
                c = groups[written]
                counters[c] = Counter(counters[c].name, counters[c].per_step + 1)
                raw.append((oi, si, spec, c))
    names = [f"{ops[oi].name}/{ops[oi].stages[si].name}[{spec.label or spec.tile}]" for oi, si, spec, _ in raw]
    waits = derive_waits(buffers, [(spec.regions, c) for _, _, spec, c in raw], counters, persistent, names, stage_of)
    tasks = []
    for (oi, si, spec, c), w in zip(raw, waits):
        code = table.index((ops[oi].kind, ops[oi].stages[si].name))
        tasks.append(Task(oi, si, spec.tile, code, spec.regions, c, w, spec.weights, spec.label))
    return Schedule(buffers, ops, counters, tasks, persistent, B, T, table)


def derive_waits(
    buffers: list[BufferInfo],
    items: list[tuple[tuple[Region, ...], int]],
    counters: list[Counter],
    persistent: bool,
    names=None,
    stage_of=None,
) -> list[tuple[Wait, ...]]:
    """Waits for tasks ``items`` = [(regions, counter)] in queue order.

    Step 0 of the sweep gives same-step needs (wait base = per_step); step 1 adds what step e+1 needs
    from step e (base 0), plus the rule that a counter's step-(e+1) increments follow its step-e ones.
    Waits implied by others (through the counters' ancestor sets) are dropped.
    """
    C = len(counters)
    anc0 = [0] * C  # counters whose same-step increments all happen before every increment of c
    anc1 = [0] * C  # ... whose previous-step increments do
    frontier = Frontier([b.size for b in buffers], [b.cols for b in buffers], [b.append_only for b in buffers])
    flat = [frontier.flatten(regions) for regions, _ in items]
    same_step: list[list[int]] = []
    for t, (_, c) in enumerate(items):
        needs = {counter_of(k) for k in frontier.required(flat[t])}
        siblings = [n for n in needs if (stage_of[n] == stage_of[c] if stage_of else n == c)]
        if siblings:
            who = names[t] if names else f"task {t}"
            raise ScheduleError(
                f"tiles of one stage conflict: {who} touches what a sibling tile ({counters[siblings[0]].name}) "
                "writes; tiles of a stage run unordered"
            )
        chosen = _reduce(needs, anc0)
        same_step.append(chosen)
        for n in chosen:
            anc0[c] |= (1 << n) | anc0[n]
        frontier.apply(flat[t], key_of(c, 0))
    prev_step: list[list[int]] = [[] for _ in items]
    if persistent:
        frontier.next_step()
        for t, (_, c) in enumerate(items):
            required = frontier.required(flat[t])
            a1 = 0
            for n in same_step[t]:
                a1 |= anc1[n]
            needs = {counter_of(k) for k in required if epoch_of(k) == 0} | {c}
            remaining = {n for n in needs if not (a1 >> n) & 1}
            chosen = _reduce(remaining, anc0)
            for n in chosen:
                a1 |= (1 << n) | anc0[n]
            anc1[c] |= a1
            prev_step[t] = chosen
            frontier.apply(flat[t], key_of(c, 1))
    return [
        tuple(Wait(n, counters[n].per_step, counters[n].per_step) for n in same)
        + tuple(Wait(n, 0, counters[n].per_step) for n in prev)
        for same, prev in zip(same_step, prev_step)
    ]


def _reduce(needs: set[int], anc: list[int]) -> list[int]:
    """The needs not already implied by another need (n is implied by m when n is an ancestor of m)."""
    cover = 0
    for m in needs:
        cover |= anc[m]
    return sorted(n for n in needs if not (cover >> n) & 1)
