"""Audit the kernel against its schedule: every task writes activation buffers only where it declares.

The validator proves the schedule race-free *given* each task's declared regions; this checks the
declarations against the code that runs. ``audit_writes(mk, env)`` runs a step task by task (each
alone in its own launch of the megakernel, in queue order, so every task sees the state its
predecessors left) and compares the step's activation buffers before and after each task: an element
that changed outside the union of the task's WRITE / ACCUMULATE regions of that buffer is reported.
(Cache, state and scratch buffers are outside its view: their layouts differ from the schedule's
abstract ``[rows, cols]``.)
"""

from __future__ import annotations

import torch

from nonstop.runtime.megakernel.tasks import Access


def _changed(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    same = before == after
    if before.is_floating_point():
        same |= torch.isnan(before) & torch.isnan(after)
    return ~same


def allowed_mask(schedule, task, name: str, shape: tuple[int, int]) -> torch.Tensor:
    mask = torch.zeros(shape, dtype=torch.bool)
    for r in task.regions:
        if schedule.buffers[r.buffer].name == name and r.access in (Access.WRITE, Access.ACCUMULATE):
            mask[r.r0 : r.r1, r.c0 : r.c1] = True
    return mask


def run_one(mk, i: int) -> None:
    """Launch the megakernel on task i alone (no waits, a private counter, queue and step)."""
    tasks = mk.tasks[i : i + 1].clone()
    tasks[0, 4:7] = 0  # counter 0 of a scratch counter set, no waits
    zeros = {
        n: torch.zeros(k, dtype=torch.int64, device=mk.device)
        for n, k in (("counters_ptr", 1), ("ticket_ptr", 1), ("state_ptr", 2))
    }
    mk.kernel[(1,)](
        **mk.arguments(tasks_ptr=tasks, prefetch_ptr=mk.prefetch[i : i + 1], num_tasks=1, **zeros), **mk.options
    )


def audit_writes(mk, env) -> list[str]:
    """Undeclared writes of one step run task by task (an empty list when the declarations hold)."""
    s = mk.schedule
    names = {b.name for b in s.buffers if b.kind == "activation"} & set(env.buf)
    problems = []
    for i, task in enumerate(s.tasks):
        before = {n: env.buf[n].clone() for n in names}
        run_one(mk, i)
        for n in names:
            t = env.buf[n]
            changed = _changed(before[n].reshape(t.shape[0], -1), t.reshape(t.shape[0], -1)).cpu()
            stray = changed & ~allowed_mask(s, task, n, tuple(changed.shape))
            if stray.any():
                r, c = (int(x) for x in stray.nonzero()[0])
                problems.append(
                    f"{s.task_name(i)} wrote {n}[{r}, {c}] ({int(stray.sum())} elements) outside its declared regions"
                )
    return problems
