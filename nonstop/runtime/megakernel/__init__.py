"""The megakernel runtime: a decode step as one persistent kernel's schedule.

``schedule``    tasks (tiles of super-ops) in topological order, epoch-based counters and waits, weight
                prefetch order: ``build_schedule(program, B, T)``; the data structures the kernel reads.
``tiling``      the per-kind tiling table (``tiles_dense``, ``tiles_attention``, ``tiles_moe``) and opcodes.
``validate``    a static proof that a schedule cannot race, deadlock or release a waiter early.
``simulate``    workers taking tickets in seeded random interleavings, with a shadow race detector
                (``shadow``); ``checksum`` (synthetic) and ``sim_program`` (plain-torch twins per tile,
                ``stage_twins``; ``steps`` sets up several steps and the sequential reference) actions.
``encode``      the integer tensors a persistent kernel reads; ``stats`` and ``estimate`` (a toy timing
                model) summarise a schedule for humans.
The persistent Triton kernel (``MegakernelExecutor`` in ``executor``): ``record`` captures the super-op
launchers' arguments, ``plan`` groups them into task classes and argument tables, ``stages`` /
``codegen`` give each class a tile body and generate the kernel, ``tiles_kernel`` tiles the ops to
match the kernels, ``advance`` prepares the next step's inputs on the device, ``kernel`` ties it
together (one launch per step, or several steps per launch). Checks beyond the validator: ``audit``
(tasks write only what they declare), ``gpu_compile`` (the generated kernel lowers to an sm_90 cubin
without a GPU).
"""

from nonstop.runtime.megakernel.schedule import Schedule, ScheduleError, build_schedule
from nonstop.runtime.megakernel.simulate import hunt, simulate
from nonstop.runtime.megakernel.validate import validate

__all__ = ["Schedule", "ScheduleError", "build_schedule", "hunt", "simulate", "validate"]


def __getattr__(name: str):
    if name == "MegakernelExecutor":  # imported lazily: it needs Triton, the schedule tools do not
        from nonstop.runtime.megakernel.executor import MegakernelExecutor

        return MegakernelExecutor
    raise AttributeError(name)
