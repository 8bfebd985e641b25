"""``StepKernel.refresh`` when the storage moved: the generated source changes but the tiling does not (recompile
in place), or the launches fall into other task classes (a new kernel)."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("triton")


def _step_kernel():
    """A kimi_linear 2x1 megakernel on the CPU and the step environment it was recorded from."""
    from nonstop.runtime.megakernel.kernel import StepKernel
    from nonstop.runtime.superop import ExecEnv
    from tests.megakernel.kernel_steps import kernel_step

    ks = kernel_step("kimi_linear", B=2, T=1)
    ex = ks.executor
    step = ex.static_step(2, 1)
    env = ExecEnv(step.buf, ks.steps.cache, step.batch)
    return StepKernel(ex.program, ks.ops, ex.impl, env, "cpu"), env


def test_a_refresh_whose_source_signature_changes_recompiles_the_kernel(monkeypatch):
    """A refresh whose re-recorded launches tile and group alike but change what the source bakes in (a
    uniform int's value, an alignment flag) must regenerate and reload the kernel: keeping the stale
    compiled kernel would run the new arguments under the old constants / alignment hints."""
    import nonstop.runtime.megakernel.kernel as kernel
    from nonstop.runtime.megakernel.codegen import source

    mk, env = _step_kernel()
    old_source, old_kernel = mk.source, mk.kernel
    real = kernel.build_plan
    changed = []

    def moved(*args, **kw):  # same stages / tiles; one uniform int baked into the source takes a new value
        plan = real(*args, **kw)
        classes = copy.deepcopy(plan.classes)
        for c in classes:
            for p in c.params:
                if p.kind == "int" and p.uniform and isinstance(p.value, int):
                    p.value += 7
                    changed.append((c.label, p.name))
                    break
            if changed:
                break
        plan.classes = classes
        return plan

    monkeypatch.setattr(kernel, "build_plan", moved)
    assert mk.refresh(env)  # the same task layout: refreshed in place ...
    assert changed, "no uniform int parameter in the plan to change"
    want = source.megakernel_source(mk.plan.classes, mk.plan.max_p, mk.plan.max_w, mk.plan.max_s)
    assert want != old_source  # the changed value is in the generated source
    assert mk.source == want  # ... but with the source regenerated for the new plan
    assert mk.kernel is not old_kernel


def test_a_refresh_that_regroups_task_classes_builds_a_new_kernel(monkeypatch):
    """The task table holds each task's class (opcode) and instance: a refresh whose re-recorded launches tile
    alike but fall into other classes (a constant that changed for some instances only splits a class and
    renumbers the rest) must say False - a new kernel and table - not keep the old opcodes under new source.
    An unchanged plan refreshes in place."""
    import dataclasses

    import nonstop.runtime.megakernel.kernel as kernel

    mk, env = _step_kernel()
    assert mk.refresh(env)  # the same launches: refreshed in place
    real = kernel.build_plan
    first, second = sorted({r.opcode for runs in mk.plan.stages for r in runs})[:2]

    def swapped(*args, **kw):  # the same stages and tiles, two classes numbered the other way round
        plan = real(*args, **kw)
        swap = {first: second, second: first}
        stages = [[dataclasses.replace(r, opcode=swap.get(r.opcode, r.opcode)) for r in runs] for runs in plan.stages]
        return dataclasses.replace(plan, stages=stages)

    monkeypatch.setattr(kernel, "build_plan", swapped)
    assert not mk.refresh(env)
