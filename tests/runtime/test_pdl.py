"""Every launcher kernel of ``nonstop/kernels`` threads programmatic dependent launch (PDL).

PDL needs an sm_90 GPU; here the launches of one step (every op of the program plus device sampling)
are recorded without running (``LaunchRecorder``: nothing executes, so no ``gdc_wait`` under the
interpreter) with ``env.pdl`` True and False. With PDL every Triton launch gets ``USE_PDL=True`` and
``launch_pdl=True``; without, ``USE_PDL=False`` and no ``launch_pdl``. Together the configurations launch
every declared launcher of the kernel families (``launch.launcher``). The megakernel built from a PDL
recording drops ``USE_PDL`` and launches without ``launch_pdl``.
"""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from nonstop.cache.state import ModelCache
from tests.runtime.helpers import tiny_model

pytest.importorskip("triton")

from nonstop.kernels import FAMILY_MODULES  # noqa: E402
from nonstop.kernels import launch as kernel_launch  # noqa: E402
from nonstop.runtime.cuda_graph import fit_pools  # noqa: E402
from nonstop.runtime.megakernel.codegen.plan import build_plan  # noqa: E402
from nonstop.runtime.megakernel.codegen.record import record_ops  # noqa: E402
from nonstop.runtime.megakernel.executor import MegakernelExecutor  # noqa: E402
from nonstop.runtime.superop import ExecEnv, kernel_table  # noqa: E402

CONFIGS = ["llama", "kimi_k3", "kimi_k3_mxfp4", "deepseek_v3"]


def pdl_launcher_functions() -> dict:
    """{name: Python function} of the declared launchers of the kernel family modules."""
    for family in FAMILY_MODULES:
        importlib.import_module(f"nonstop.kernels.{family}")
    return {
        fn.__name__: fn
        for fn, decl in kernel_launch.DECLARATIONS.items()
        if kernel_launch.python_function(decl.tile_fn).__module__.startswith("nonstop.kernels.")
    }


def pdl_launchers() -> set[str]:
    return set(pdl_launcher_functions())


def record_step(name: str, pdl: bool, B: int = 2, T: int = 2):
    """(executor, launches per op) of one B x T step of tiny ``name``: the program's ops and sampling."""
    model = tiny_model(name)
    ex = MegakernelExecutor(model, graphs=False)
    cache = ModelCache(model.cfg, B, capacity=16, dtype=torch.float32, device="cpu", page_size=4)
    prefill = cache.batch(list(range(B)), 3)
    cache.advance(prefill)
    cache.batch(list(range(B)), T)
    step = ex.static_step(B, T)
    fit_pools(cache)
    ops = list(ex.program.ops) + ex.extra_ops[:1]  # + sample (the next one, advance, is the megakernel's own)
    assert ops[-1].kind == "sample"
    return ex, record_ops(ops, kernel_table(), ExecEnv(step.buf, cache, step.batch, pdl=pdl))


@pytest.fixture(scope="module")
def recorded() -> dict:
    return {(name, pdl): record_step(name, pdl) for name in CONFIGS for pdl in (True, False)}


@pytest.mark.parametrize("name", CONFIGS)
def test_every_launch_opts_in_exactly_when_the_step_may(recorded, name):
    for pdl in (True, False):
        _, per_op = recorded[name, pdl]
        launches = [launch for op_launches in per_op for launch in op_launches]
        assert all(op_launches for op_launches in per_op), "every op launches a kernel"
        for launch in launches:
            assert launch.args.get("USE_PDL") is pdl, (launch.name, pdl)
            assert launch.options.get("launch_pdl", False) is pdl, (launch.name, pdl)
            assert ("launch_pdl" in launch.options) == pdl, launch.name


def test_every_launcher_kernel_is_covered(recorded):
    launched = {launch.name for (_, pdl), (_, per_op) in recorded.items() if pdl for ops in per_op for launch in ops}
    expected = pdl_launchers()
    assert len(expected) >= 15
    assert expected == launched, (
        f"launchers never launched here: {expected - launched}; launched without USE_PDL: {launched - expected}"
    )


def test_every_launcher_waits_before_its_body():
    """A launch with ``launch_pdl`` may start before its predecessor ends: the launcher's first statement
    must be the wait, its second the tile function, on the launcher's own parameters (minus USE_PDL)."""
    for name, fn in pdl_launcher_functions().items():
        body = [line.strip() for line in inspect.getsource(fn).split("):", 1)[1].splitlines() if line.strip()]
        assert body[0] == "pdl_wait(USE_PDL)", (name, body[0])
        params = [p for p in inspect.signature(fn).parameters if p != "USE_PDL"]
        assert body[1].startswith("tile_fn(tl.program_id(0), ") and all(p in body[1] for p in params), (name, body[1])
        assert len(body) == 2, name


def test_megakernel_plan_drops_pdl(recorded):
    """A plan built from launches recorded with PDL on bakes USE_PDL=False into every task class and
    does not launch the persistent kernel with launch_pdl."""
    _, per_op = recorded["llama", True]
    plan = build_plan(per_op, "cpu")
    consts = [p for cls in plan.classes for p in cls.params if p.name == "USE_PDL"]
    assert consts and all(p.kind == "const" and p.value is False for p in consts)
    assert "launch_pdl" not in plan.launch_options
    from nonstop.runtime.megakernel.codegen import source

    text = source.megakernel_source(plan.classes, plan.max_p, plan.max_s, 16)
    assert "USE_PDL" not in text and "gdc_wait" not in text
