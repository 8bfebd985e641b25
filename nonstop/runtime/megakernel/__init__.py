"""The megakernel backend: a decode step as ONE launch of a persistent Triton kernel.

Where things are:
  ``tasks``      the task types: buffers, regions, tiles, stages, tasks, counters, waits, the Schedule.
  ``tiling/``    the one tiling: each kind's tiles from its recorded launch (``TILINGS``), counters and
                 waits from the regions (``waits``); ``tile_step`` gives the schedule the kernel runs.
  ``codegen/``   the code generator: ``record`` (capture the super-op launchers' launches without running
                 them), ``plan`` (task classes and argument tables), ``source`` (the kernel's Triton source).
  runtime        ``kernel`` (``StepKernel``: one step shape's schedule, tables and launches), ``executor``
                 (``MegakernelExecutor``), ``advance`` (the device-side step advance).
  ``verify/``    the checks: ``validate`` (a static proof: no race, deadlock or early release),
                 ``simulate`` / ``shadow`` (seeded adversarial interleavings with a race detector),
                 ``sim_program`` + ``twins`` + ``steps`` (the simulator running plain-torch twins per tile
                 against the reference), ``checksum`` (synthetic actions), ``audit`` (each task writes only
                 what it declares), ``stats``.
  ``frontier``   the per-buffer access frontiers both the waits and the validator are derived from.
Import order (no cycles): tasks < frontier < tiling < codegen < verify < kernel < executor.
"""

from nonstop.runtime.megakernel.tasks import Schedule, ScheduleError
from nonstop.runtime.megakernel.verify.simulate import hunt, simulate
from nonstop.runtime.megakernel.verify.validate import validate

__all__ = ["Schedule", "ScheduleError", "hunt", "simulate", "validate"]


def __getattr__(name: str):
    if name == "MegakernelExecutor":  # imported lazily: it needs Triton, the schedule tools do not
        from nonstop.runtime.megakernel.executor import MegakernelExecutor

        return MegakernelExecutor
    raise AttributeError(name)
