"""Audit the kernel against its schedule: every task writes only where it declares.

The validator proves the schedule race-free *given* each task's declared regions; this checks the
declarations against the code that runs. ``audit_writes(mk, env)`` runs a step task by task (each
alone in its own launch of the megakernel, in queue order, so every task sees the state its
predecessors left) and compares every tensor a task could reach before and after each task:

  activation buffers    ``env.buf[name]`` ``[R, row_numel]``, row by row as the schedule sees them;
  ``start``             the step's ``[B]`` start positions (row b = sequence b);
  attention caches      each layer's page pool ``[pool rows, per-token values]``: region row r (token t of
                        sequence b) is pool row ``pages.rows(slots[b], start[b] + t)``;
  KDA state             each layer's ``recurrent`` / ``conv`` ``[slots, values]``: region row b is slot
                        ``slots[b]``; in a ``keep_states`` step also that slot's per-token history, every
                        token, in the region's columns;
  workspaces            every ``nonstop.kernels.launch`` workspace, flat. A scratch buffer named as a
                        workspace has that workspace's layout: region ``[rows, cols]`` covers its elements
                        ``r * cols + c``. A scratch buffer that stands for several workspaces in a layout of
                        its own (``PARTS``: the split-KV partials, the sampler's cells, the routing table)
                        lets a task that writes any of it change those workspaces anywhere — which tile
                        wrote which cell there is the simulator's check (``sim_program``), not this one's.

An element that changed outside the union of the task's WRITE / ACCUMULATE regions mapped this way is
reported — in a tensor the schedule names or not (another layer's cache, another sequence's slot, an
unused workspace all count). The workspaces are filled with NaN (-1 for integers; the zeroed phase
counters are kept) first: they outlive a step, and a write of the value an earlier step left would not
show. The audit has a launch's effects: the step ran once (its ``start`` advanced); audit a step once.
"""

from __future__ import annotations

import torch

from nonstop.cache.state import KDAState
from nonstop.kernels import launch
from nonstop.runtime.megakernel.tasks import Access
from nonstop.runtime.megakernel.verify.sim_program import layer_rows

WRITES = (Access.WRITE, Access.ACCUMULATE)

# scratch buffers of the schedule that stand for several kernel workspaces (in an order of their own)
PARTS = {
    "gqa_attn.partial": ("gqa_attn.ml", "gqa_attn.acc"),
    "mla_attn.partial": ("mla_attn.ml", "mla_attn.acc"),
    "sample.partial": ("sample.stats", "sample.best_idx", "sample.cand", "sample.scored"),
    "moe_experts.route": ("moe_experts.ids", "moe_experts.p"),
}


def _changed(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    same = before == after
    if before.is_floating_point():
        same |= torch.isnan(before) & torch.isnan(after)
    return ~same


def _rows2d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1)


def reachable(mk, env) -> dict[str, torch.Tensor]:
    """Every tensor a task of the step could write, by a name for reports, each seen as 2-D."""
    out = {f"buf.{n}": _rows2d(t) for n, t in env.buf.items()}
    out["start"] = env.batch.start.view(-1, 1)
    for i, layer in enumerate(env.cache.layers):
        if isinstance(layer, KDAState):
            for name in ("recurrent", "conv", "history_recurrent", "history_conv", "history_rows"):
                t = getattr(layer, name)
                if t is not None:
                    out[f"L{i}.{name}"] = _rows2d(t)
        else:
            for name, t in layer.tensors.items():
                out[f"L{i}.{name}"] = _rows2d(t)
    device = str(torch.device(mk.device))
    for (name, dev, dtype), t in launch._WORKSPACES.items():
        if dev == device:
            out[f"workspace.{name}.{str(dtype).removeprefix('torch.')}"] = t.view(1, -1)
    return out


def poison_workspaces(device) -> None:
    """Fill the kernels' workspaces on ``device`` with NaN / -1, all but the zeroed phase counters."""
    device = str(torch.device(device))
    for (name, dev, _), t in launch._WORKSPACES.items():
        if dev == device and not name.endswith(".phases"):
            t.fill_(float("nan") if t.is_floating_point() else -1)


def _workspace_keys(name: str, views: dict) -> list[str]:
    return [k for k in views if k.startswith(f"workspace.{name}.") and "." not in k[len(f"workspace.{name}.") :]]


def allowed(schedule, task, env, views: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """For each tensor of ``views`` the task may change, a bool mask of the elements its declared
    WRITE / ACCUMULATE regions cover (tensors missing from the result may not change at all)."""
    batch = env.batch
    masks: dict[str, torch.Tensor] = {}

    def mark(key: str, rows, c0: int, c1: int) -> None:
        if key not in views:
            return
        m = masks.setdefault(key, torch.zeros(views[key].shape, dtype=torch.bool))
        m[rows, c0:c1] = True

    for r in task.regions:
        if r.access not in WRITES:
            continue
        info = schedule.buffers[r.buffer]
        if info.kind == "activation":
            mark(f"buf.{info.name}", slice(r.r0, r.r1), r.c0, r.c1)
        elif info.kind == "step":
            mark("start", slice(r.r0, r.r1), r.c0, r.c1)
        elif info.kind == "state":
            slots = layer_rows(info, None, batch, r.r0, r.r1).cpu()
            mark(f"L{info.layer}.{info.tensor}", slots, r.c0, r.c1)
            history = f"L{info.layer}.history_{info.tensor}"
            if batch.keep_states and history in views:  # [S, T * cols]: token t of the slot at t*cols + c
                cols = info.cols
                for t in range(views[history].shape[1] // cols):
                    mark(history, slots, t * cols + r.c0, t * cols + r.c1)
        elif info.kind == "cache":
            rows = layer_rows(info, env.cache.layers[info.layer], batch, r.r0, r.r1).cpu()
            mark(f"L{info.layer}.{info.tensor}", rows, r.c0, r.c1)
        elif info.kind == "scratch" and info.name in PARTS:
            for part in PARTS[info.name]:
                for key in _workspace_keys(part, views):
                    mark(key, 0, 0, views[key].shape[1])
        elif info.kind == "scratch":
            flat = (torch.arange(r.r0, r.r1)[:, None] * info.cols + torch.arange(r.c0, r.c1)[None, :]).reshape(-1)
            for key in _workspace_keys(info.name, views):
                mark(key, 0, 0, 0)  # the mask exists even when the region is empty
                masks[key][0, flat[flat < views[key].shape[1]]] = True
        else:
            raise ValueError(f"audit: buffer {info.name} of unknown kind {info.kind!r}")
    return masks


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
    poison_workspaces(mk.device)
    problems = []
    for i, task in enumerate(s.tasks):
        views = reachable(mk, env)
        before = {k: v.clone() for k, v in views.items()}
        run_one(mk, i)
        masks = allowed(s, task, env, views)
        for key, t in views.items():
            changed = _changed(before[key], t).cpu()
            stray = changed & ~masks[key] if key in masks else changed
            if stray.any():
                r, c = (int(x) for x in stray.nonzero()[0])
                problems.append(
                    f"{s.task_name(i)} wrote {key}[{r}, {c}] ({int(stray.sum())} elements) outside its declared regions"
                )
    return problems
