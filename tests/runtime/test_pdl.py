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
    """A launch with ``launch_pdl`` may start before its predecessor ends: before the wait a launcher does
    nothing but take its program id and (with PDL) request its weight slice into L2; after it, the tile
    function on the launcher's own parameters (minus USE_PDL)."""
    prefetching = set()
    for name, fn in pdl_launcher_functions().items():
        body = [line.strip() for line in inspect.getsource(fn).split("):", 1)[1].splitlines() if line.strip()]
        wait = body.index("pdl_wait(USE_PDL)")
        before = body[1:wait]
        assert body[0] == "pid = tl.program_id(0)" and len(body) == wait + 2, (name, body)
        if before:
            assert (
                before[0].startswith("if USE_PDL:")
                and len(before) == 2
                and before[1].startswith("prefetch_l2((w") | before[1].startswith("prefetch_l2((up")
            ), (name, before)
            prefetching.add(name)
        params = [p for p in inspect.signature(fn).parameters if p != "USE_PDL"]
        assert body[-1].startswith("tile_fn(pid, ") and all(p in body[-1] for p in params), (name, body[-1])
    assert {
        "gemv_kernel",
        "mlp_kernel",
        "kda_in_proj_kernel",
        "mla_in_proj_kernel",
        "moe_tail_kernel",
    } <= prefetching, prefetching


def test_megakernel_plan_drops_pdl(recorded):
    """A plan built from launches recorded with PDL on bakes USE_PDL=False into every task class; the
    generated kernel neither waits on a grid dependency nor passes USE_PDL to a tile."""
    _, per_op = recorded["llama", True]
    plan = build_plan(per_op, "cpu")
    consts = [p for cls in plan.classes for p in cls.params if p.name == "USE_PDL"]
    assert consts and all(p.kind == "const" and p.value is False for p in consts)
    from nonstop.runtime.megakernel.codegen import source

    text = source.megakernel_source(plan.classes, plan.max_p, plan.max_w, plan.max_s)
    assert "USE_PDL" not in text and "gdc_wait" not in text
