"""The schedule the megakernel runs, for a tiny model of any family, ready for the validator, the simulator
and the broken-schedule suite.

``kernel_step(name, B, T, steps)`` prefills a few sequences (``verify.steps.prepare_steps``: the pages of
every step reserved up front), records the step's launches (the model's ops, ``sample`` and ``advance``)
as the megakernel executor does, and tiles them (``kernel.step_schedule``). Launches are recorded for an
interpreter-style target with ``sms`` SMs (default 8): more, smaller tiles than the interpreter's 2-SM
stand-in gives, so interleavings have many tasks to reorder.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from nonstop.kernels import platform
from nonstop.runtime.megakernel.executor import MegakernelExecutor
from nonstop.runtime.megakernel.kernel import step_schedule
from nonstop.runtime.megakernel.tasks import Schedule
from nonstop.runtime.megakernel.verify.sim_program import ProgramActions
from nonstop.runtime.megakernel.verify.steps import Steps, prepare_steps, reference_logits
from nonstop.runtime.superop import ExecEnv
from tests.runtime.helpers import tiny_model


@dataclass
class KernelStep:
    model: object
    executor: MegakernelExecutor
    steps: Steps
    schedule: Schedule
    ops: list
    launches: list
    seed: int

    def fresh_steps(self) -> Steps:
        """The same prefilled state and steps again (a run mutates its caches)."""
        return prepare_steps(self.model, self.schedule.B, self.schedule.T, len(self.steps.batches), seed=self.seed)

    def actions(self) -> ProgramActions:
        st = self.fresh_steps()
        return ProgramActions(self.schedule, self.executor.program, self.ops, st.cache, st.batches, st.ids[0], st.ids)

    def reference(self) -> list[torch.Tensor]:
        return reference_logits(self.executor.program, self.fresh_steps())


def kernel_step(
    name: str, B: int = 2, T: int = 2, steps: int = 1, seed: int = 0, sms: int = 8, model=None
) -> KernelStep:
    model = model if model is not None else tiny_model(name, seed=seed + 4)
    ex = MegakernelExecutor(model, graphs=False)
    st = prepare_steps(model, B, T, steps, seed=seed)
    step = ex.static_step(B, T)
    step.slots.copy_(st.batches[0].slots)
    step.start.copy_(st.batches[0].start)
    ops = [*ex.program.ops, *ex.extra_ops]
    with platform.simulating(replace(platform.INTERPRETER, sms=sms)):
        launches, _, schedule, *_ = step_schedule(
            ex.program, ops, ex.impl, ExecEnv(step.buf, st.cache, step.batch), "cpu"
        )
    return KernelStep(model, ex, st, schedule, ops, launches, seed)
