"""The persistent megakernel of one step shape: schedule, generated kernel, tables, one launch per step.

``StepKernel(program, ops, kernels, env, device, grid)`` records the ops' launches (``codegen.record``),
groups them into task classes (``codegen.plan``), tiles the ops as the launches do (``tiling``; a
*persistent* schedule: step e+1's tasks also wait for what they need of step e, so one launch may run
several steps), validates the schedule (``verify.validate``: a rejection raises ``ScheduleError`` before
anything is launched), and generates the kernel (``codegen.source``). ``refresh(env)`` re-records the
arguments only (cache storage moved: new addresses, same schedule). ``launch(num_steps)`` runs one step
(or several back to back).

Device tensors the kernel reads:
  tasks     int32 [N, 7]  opcode (task class), instance, tile, ntiles, counter, wait_begin, wait_end
  waits     int32 [W, 3]  counter, base, per_step: ready in step e when counters[c] >= e·per_step + base
  prefetch  int64 [N, 2]  address and bytes (<= PREFETCH_LINES·128) of the task's first weight slice
  counters  int64 [C]     zero once, never reset (epoch-based targets)
  ticket    int64 [1]     the queue: ticket q is task q mod N of step q div N; ends each launch at a
                          multiple of N (programs undo the one ticket they take past the end)
  state     int64 [2]     (next step, programs exited): the last program out advances the step, so
                          consecutive launches (and CUDA-graph replays) need no host arguments
  ptrs / ints / floats    per-instance arguments (``plan``)
"""

from __future__ import annotations

import torch

from nonstop.kernels.platform import num_sms
from nonstop.runtime.megakernel.codegen import source
from nonstop.runtime.megakernel.codegen.plan import build_plan
from nonstop.runtime.megakernel.codegen.record import record_ops
from nonstop.runtime.megakernel.tasks import ScheduleError
from nonstop.runtime.megakernel.tiling import tile_step
from nonstop.runtime.megakernel.verify.validate import validate

PREFETCH_LINES = 1024  # cache lines (128 B) of a task's first weight slice requested before its waits: 128 KiB
# (one int32 per line, 4 registers a thread at 8 warps; 132 SMs x 128 KiB = 17 MB in flight, a third of L2)
NUM_FIELDS = 7


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


def step_schedule(program, ops, kernels: dict, env, device) -> tuple:
    """(launches per op, Plan, Schedule, opcode / instance / tile count per task) of one step of ``ops``
    (launch functions ``kernels``; ``env`` the step's buffers, cache and batch): its launches recorded,
    grouped into task classes, tiled as they run. Nothing is launched or validated here."""
    launches = record_ops(ops, kernels, env)
    plan = build_plan(launches, device)
    schedule, codes, instances, ntiles = tile_step(
        program, ops, launches, plan, env.B, env.T, start=env.batch.start, persistent=True
    )
    return launches, plan, schedule, codes, instances, ntiles


class StepKernel:
    """The megakernel of one step shape (B sequences × T tokens)."""

    def __init__(self, program, ops, kernels: dict, env, device, grid: int | None = None):
        self.program, self.ops, self.kernels, self.device = program, ops, kernels, device
        self.grid = grid or num_sms(device)  # one program per SM (2 under the interpreter)
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
        self.sink = torch.zeros(1, dtype=torch.int32, device=device)
        self._compile()

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
        self.source = source.megakernel_source(self.plan.classes, self.plan.max_p, self.plan.max_s, PREFETCH_LINES)
        module = source.load_source("megakernel", self.source)
        self.kernel, self.path = module.megakernel, module.__file__

    def refresh(self, env) -> bool:
        """Re-record the arguments (cache storage moved: new addresses). False when the launches now
        tile differently (e.g. a wider page table changed the split-KV count): build a new kernel."""
        plan = build_plan(record_ops(self.ops, self.kernels, env), self.device)
        if [[(r.name, r.ntiles) for r in runs] for runs in plan.stages] != [
            [(r.name, r.ntiles) for r in runs] for runs in self.plan.stages
        ]:
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

    def launch(self, num_steps: int = 1) -> None:
        p = self.plan
        self.kernel[(self.grid,)](
            self.tasks,
            self.waits,
            self.prefetch,
            self.counters,
            self.ticket,
            self.state,
            self.sink,
            p.ptrs,
            p.ints,
            p.floats,
            self.num_tasks,
            num_steps,
            NUM_FIELDS=NUM_FIELDS,
            num_warps=p.launch_options.get("num_warps", 4),
        )
