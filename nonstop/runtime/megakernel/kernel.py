"""The persistent megakernel of one step shape: schedule, generated kernel, tables, one launch per step.

``StepKernel(program, ops, kernels, env, device, grid)`` records the ops' launches (``codegen.record``),
groups them into task classes (``codegen.plan``), tiles the ops as the launches do (``tiling``; a
*persistent* schedule: step e+1's tasks also wait for what they need of step e, so one launch may run
several steps), validates the schedule (``verify.validate``: a rejection raises ``ScheduleError`` before
anything is launched), and generates the kernel (``codegen.source``). ``refresh(env)`` re-records the
arguments only (cache storage moved: new addresses, same schedule). ``launch(num_steps)`` runs one step
(or several back to back).

The kernel loop (``codegen/source.py``), per program:

    q = ticket++                                   # ticket q = task q % N of step q // N
    request the first weight lines of task q into L2
    while q < end:
        spin until each wait's counter >= its target (the poll is an acquire; one thread polls, the CTA
        waits at a barrier, with nanosleep backoff)
        q_next = ticket++; request task q_next's first weight lines      # before this body runs
        run task q's tile; barrier; counters[task's counter] += 1 (release)
        q = q_next
    ticket-- (the one ticket taken past the end); the last program out advances ``state``

A program holds at most two tickets (q and q_next, q < q_next); a task waits only on smaller tickets, so
the smallest unfinished ticket always belongs to a running task whose waits are met: no deadlock at any
grid size (and programs need not be co-resident).

Launch shape: ``MEGAKERNEL_WARPS`` warps (8: every task class gets up to 255 registers a thread; a class
that wants more work per task splits its tiles instead), and on a GPU a grid of as many CTAs as fit at
once (``persistent_grid``: the compiled kernel's registers and shared memory against the device's limits;
a kernel that cannot run at all is refused with a clear error). Under the interpreter: 2 programs.

Device tensors the kernel reads:
  tasks     int32 [N, 7]  opcode (task class), instance, tile, ntiles, counter, wait_begin, wait_end
  waits     int32 [W, 3]  counter, base, per_step: ready in step e when counters[c] >= e·per_step + base
  prefetch  int64 [N, 2]  address and bytes (<= PREFETCH_LINES·128) of the task's first weight slice
  counters  int64 [C]     zero once, never reset (epoch-based targets)
  ticket    int64 [1]     the queue: ticket q is task q mod N of step q div N; ends each launch at a
                          multiple of N (programs undo the one ticket they take past the end)
  state     int64 [2]     (next step, programs exited): the last program out advances the step, so
                          consecutive launches (and CUDA-graph replays) need no host arguments
  ptrs / wptrs / ints / floats    per-instance arguments (``codegen.plan``)
"""

from __future__ import annotations

import torch

from nonstop.kernels import platform
from nonstop.runtime.megakernel.codegen import source
from nonstop.runtime.megakernel.codegen.plan import build_plan
from nonstop.runtime.megakernel.codegen.record import record_ops
from nonstop.runtime.megakernel.tasks import ScheduleError
from nonstop.runtime.megakernel.tiling import tile_step
from nonstop.runtime.megakernel.verify.validate import validate

PREFETCH_LINES = 1024  # 128-byte lines of a task's first weight slice requested into L2 ahead of it: 128 KiB
NUM_FIELDS = 7
MEGAKERNEL_WARPS = platform.TILE_WARPS


def prefetch_row(op, weights) -> tuple[int, int]:
    """(address, bytes) of the first statically known contiguous weight slice of a task, else (0, 0)."""
    for w in weights:
        t = op.weights.get(w.role)
        if t is None or w.dynamic or not t.is_contiguous():
            continue
        if w.dim == -1:
            lo, n = t.data_ptr(), t.numel() * t.element_size()
        elif w.dim == 0:
            row = t.stride(0) * t.element_size()
            lo, n = t.data_ptr() + w.start * row, (w.stop - w.start) * row
        else:
            continue
        return lo, min(n, PREFETCH_LINES * 128)
    return 0, 0


def persistent_grid(target: platform.Target, registers: int, shared_bytes: int, num_warps: int) -> int:
    """Programs of the persistent kernel on ``target``: every SM filled with as many CTAs as fit at once
    (registers per thread and shared memory per CTA against the SM's); a ``RuntimeError`` naming the
    numbers when not even one fits."""
    per_sm = target.occupancy(registers, shared_bytes, num_warps)
    if per_sm < 1:
        raise RuntimeError(
            f"the megakernel cannot run on {target.name}: {registers} registers x {32 * num_warps} threads and "
            f"{shared_bytes} bytes of shared memory per CTA exceed what one SM holds ({target.regs_per_sm} registers, "
            f"{target.smem_per_block} bytes of shared memory per CTA)"
        )
    return per_sm * target.sms


def step_schedule(program, ops, kernels: dict, env, device) -> tuple:
    """(launches per op, Plan, Schedule, opcode / instance / tile count per task) of one step of ``ops``
    (launch functions ``kernels``; ``env`` the step's buffers, cache and batch): its launches recorded,
    grouped into task classes, tiled as they run. Nothing is launched or validated here."""
    launches = record_ops(ops, kernels, env)
    plan = build_plan(launches, device)
    start = env.batch.start
    schedule, codes, instances, ntiles = tile_step(
        program, ops, launches, plan, env.B, env.T, start=start, persistent=True
    )
    return launches, plan, schedule, codes, instances, ntiles


class StepKernel:
    """The megakernel of one step shape (B sequences × T tokens)."""

    def __init__(self, program, ops, kernels: dict, env, device, grid: int | None = None):
        self.program, self.ops, self.kernels, self.device = program, ops, kernels, device
        self.B, self.T = env.B, env.T
        _, self.plan, self.schedule, codes, instances, ntiles = step_schedule(program, ops, kernels, env, device)
        try:  # a race, deadlock or early release: refuse before anything is launched
            validate(self.schedule)
        except ScheduleError as exc:
            raise ScheduleError(
                f"megakernel schedule for {self.B}x{self.T} rows rejected by the validator: {exc}"
            ) from exc
        self._encode(codes, instances, ntiles)
        self.counters = torch.zeros(len(self.schedule.counters), dtype=torch.int64, device=device)
        self.ticket = torch.zeros(1, dtype=torch.int64, device=device)
        self.state = torch.zeros(2, dtype=torch.int64, device=device)
        # every register a thread may have: ptxas would otherwise aim at 2 CTAs of 8 warps per SM (128
        # registers) and spill in the largest classes; the grid is sized to what fits (``_grid``)
        self.options = {"num_warps": MEGAKERNEL_WARPS, "maxnreg": 255}
        self._compile()
        self.grid = grid or self._grid()

    # ------------------------------------------------------------------ tables
    def _encode(self, codes, instances, ntiles) -> None:
        rows, waits, prefetch = [], [], []
        for t, code, inst, n in zip(self.schedule.tasks, codes, instances, ntiles):
            w0 = len(waits)
            waits += [(w.counter, w.base, w.per_step) for w in t.waits]
            rows.append((code, inst, t.tile, n, t.counter, w0, len(waits)))
            prefetch.append(prefetch_row(self.ops[self.schedule.ops[t.op].program_op], t.weights))
        self.tasks = torch.tensor(rows, dtype=torch.int32).view(-1, NUM_FIELDS).to(self.device)
        self.waits = torch.tensor(waits or [(0, 0, 0)], dtype=torch.int32).view(-1, 3).to(self.device)
        self.prefetch = torch.tensor(prefetch, dtype=torch.int64).view(-1, 2).to(self.device)

    def _compile(self) -> None:
        p = self.plan
        self.source = source.megakernel_source(p.classes, p.max_p, p.max_w, p.max_s)
        module = source.load_source("megakernel", self.source)
        self.kernel, self.path = module.megakernel, module.__file__

    def _grid(self) -> int:
        """One program per SM of the interpreter's stand-in; on a GPU, ``persistent_grid`` of the compiled kernel."""
        target = platform.target(self.device)
        if not target.gpu or torch.device(self.device).type != "cuda":
            return target.sms
        compiled = self.kernel.warmup(grid=(1,), **self.arguments(), **self.options)
        compiled._init_handles()  # loads the module: the driver's register count
        return persistent_grid(target, compiled.n_regs, compiled.metadata.shared, self.options["num_warps"])

    def refresh(self, env) -> bool:
        """Re-record the arguments (cache storage moved: new addresses). False when the launches now
        tile differently (e.g. a wider page table changed the split-KV count) or are grouped into other task
        classes or instances (the task table holds both per task): build a new kernel."""
        plan = build_plan(record_ops(self.ops, self.kernels, env), self.device)
        if _task_layout(plan) != _task_layout(self.plan):
            return False
        recompile = plan.signature() != self.plan.signature()
        self.plan = plan
        if recompile:
            self._compile()
        return True

    # ------------------------------------------------------------------ running
    @property
    def num_tasks(self) -> int:
        return self.tasks.shape[0]

    def arguments(self, num_steps: int = 1, **override) -> dict:
        """The kernel's arguments by name (``override`` replaces tables, e.g. one task alone)."""
        p = self.plan
        args = dict(
            tasks_ptr=self.tasks,
            waits_ptr=self.waits,
            prefetch_ptr=self.prefetch,
            counters_ptr=self.counters,
            ticket_ptr=self.ticket,
            state_ptr=self.state,
            ptrs_ptr=p.ptrs,
            wptrs_ptr=p.wptrs,
            ints_ptr=p.ints,
            floats_ptr=p.floats,
            num_tasks=self.num_tasks,
            num_steps=num_steps,
            NUM_FIELDS=NUM_FIELDS,
            PREFETCH_LINES=PREFETCH_LINES,
        )
        return args | override

    def launch(self, num_steps: int = 1) -> None:
        self.kernel[(self.grid,)](**self.arguments(num_steps), **self.options)


def _task_layout(plan) -> list[list[tuple]]:
    """What a plan's task table encodes per op: each stage's name, task class (opcode), instance and tiles."""
    return [[(r.name, r.opcode, r.instance, r.ntiles) for r in runs] for runs in plan.stages]
