"""The static rules: every statically caught cheat of the corpus is rejected for the reason it names;
the built-in kernels, the test kernels and every search candidate pass; the rules hold under renaming."""

from __future__ import annotations

import pytest

from nonstop.kernels import KERNELS
from nonstop.tune.search import SearchProposer
from nonstop.tune.static_check import static_check
from nonstop.tune.verify import builtin_source
from tests.tune.helpers import CORPUS, CORRECT, expectation

STATIC = [p for p in CORPUS if expectation(p)[1] == "static"]
DYNAMIC = [p for p in CORPUS if expectation(p)[1] == "dynamic"]


@pytest.mark.parametrize("path", STATIC, ids=lambda p: p.stem)
def test_static_cheats_are_rejected(path):
    kind, _, phrase = expectation(path)
    problems = static_check(path.read_text(), kind)
    assert problems, f"{path.name} passed the static rules"
    assert any(phrase in p for p in problems), problems


@pytest.mark.parametrize("path", DYNAMIC + CORRECT, ids=lambda p: p.stem)
def test_files_for_the_dynamic_checks_pass_the_static_rules(path):
    """Their cheats can only be seen by running them: the sandbox must catch them (test_verify.py)."""
    assert static_check(path.read_text(), expectation(path)[0] if path in DYNAMIC else "linear_residual") == []


@pytest.mark.parametrize("kind", sorted(k for k in KERNELS if k != "sample"))
def test_builtin_and_search_candidates_pass(kind):
    assert static_check(builtin_source(kind), kind) == []
    search = SearchProposer(kind)
    for config in search.moves():
        assert static_check(search.source(config), kind) == [], config


MLP = "from nonstop.kernels.dense import mlp"
JIT_K = ["import triton", "@triton.jit", "def k(x):"]
LAUNCH_K = ["def launch(op, env):", "    k[(1,)](op)"]


def src(*lines: str) -> str:
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("source,phrase", [
    (src("def launch(op, env):", "    return ("), "syntax error at line"),
    (src("import torch as T", MLP, "def launch(op, env):", "    T.mm(op, env)"), "torch.mm"),
    (src("from torch import cuda", MLP, "def launch(op, env):", "    cuda.synchronize()"), "torch.cuda.synchronize"),
    (src("import triton", MLP, "def launch(op, env):", "    triton.runtime.driver.active.get_current_stream()"),
     "triton.runtime"),
    (src("import triton.language as tl", *JIT_K,
         "    tl.inline_asm_elementwise('', '', [x], dtype=tl.int32, is_pure=True, pack=1)", *LAUNCH_K),
     "inline_asm_elementwise"),
    (src("import torch", *JIT_K, "    torch.ones(1)", *LAUNCH_K), "torch inside the Triton kernel"),
    (src("import triton", "def helper(x):", "    return x", *JIT_K[1:], "    helper(x)", *LAUNCH_K),
     "may only use Triton functions"),
    (src(MLP, "def launch(op, env):", "    env.buf.update({})", "    mlp(op, env)"), ".update"),
    (src(MLP, "def launch(op, env):", "    x = env.buf['h']", "    x.data_ptr()", "    mlp(op, env)"), ".data_ptr"),
    (src(MLP, "def launch(op, env):", "    mlp.fn.__globals__"), "dunder"),
    (src(MLP, "def launch(op, env):", "    f = lambda: 0", "    f.__code__"), "dunder"),
    (src(MLP, "launch = mlp", "launch.cache = {}"), "module-level"),
    (src("from nonstop.kernels.launch import _WORKSPACES", MLP + " as launch"), "mutable container"),
    (src(MLP, "def launch(op):", "    mlp(op, None)"), "launch(op, env)"),
    (src("import triton", "@triton.jit", "def launch(op, env):", "    pass"), "not a Triton kernel"),
    (src("import math"), "no launch(op, env)"),
    (src(MLP, "async def launch(op, env):", "    mlp(op, env)"), "async"),
    (src(MLP, "def launch(op, env):", "    global X", "    mlp(op, env)"), "global"),
    (src(MLP, "def launch(op, env):", "    import os", "    mlp(op, env)"), "imports inside functions"),
    (src(MLP, "def launch(op, env):", "    g = op.weights.get", "    g.__self__"), "dunder"),
    (src(MLP, "def launch(op, env):", "    e = SystemExit"), "SystemExit"),
    # allow-lists: every module name, builtin and host attribute a candidate uses must be listed
    (src("from typing import sys", MLP, "def launch(op, env):", "    mlp(op, env)"), "from typing import sys"),
    (src("import typing as T", MLP, "def launch(op, env):", "    T.sys.modules"), "typing.sys"),
    (src("import typing", MLP, "def launch(op, env):", "    t = typing", "    mlp(op, env)"), "modules are not values"),
    (src("import math", MLP, "def launch(op, env):", "    math.__loader__"), "dunder"),
    (src("import triton.language as tl", MLP, "def launch(op, env):", "    tl.core.builtins"), "triton.language.core"),
    (src("from triton.language.core import builtin", MLP + " as launch"), "from triton.language.core import"),
    (src("import triton.runtime", MLP + " as launch"), "import triton.runtime"),
    (src("import triton", MLP, "def launch(op, env):", "    triton.knobs.os.environ"), "triton.knobs"),
    (src("import triton.language as tl", *JIT_K, "    tl.extra.cuda.globaltimer()", *LAUNCH_K),
     "triton.language.extra.cuda.globaltimer"),
    (src("import triton", MLP, "def launch(op, env):", "    triton.cdiv.fn"), "nothing may follow triton.cdiv"),
    (src("from nonstop.kernels.launch import workspace", MLP + " as launch"), "not a host function a candidate"),
    (src("from nonstop.kernels.platform import gpu_numerics_mode", MLP + " as launch"), "not a host function"),
    (src(MLP, "def launch(op, env):", "    print(op)", "    mlp(op, env)"), "the name 'print'"),
    (src(MLP, "def launch(op, env):", "    next(iter(op.reads))", "    mlp(op, env)"), "the name 'next'"),
    (src(MLP, "def launch(op, env):", "    vars(op)"), "the name 'vars'"),
    (src(MLP, "def launch(op, env):", "    str.format('{0.__class__}', op)"), ".format"),
    (src(MLP, "def launch(op, env):", "    op.cost"), ".cost is not allowed"),
    (src(MLP, "def launch(op, env):", "    env.buf['h'].storage_offset()", "    mlp(op, env)"), ".storage_offset"),
    (src(MLP, "def launch(op, env):", "    env.cache.layers[0].write(env.batch, k=env.buf['h'])"), ".write"),
    (src(MLP, "def launch(op, env):", "    op.attrs['experts'].add_module('s', None)"), ".add_module"),
    (src(MLP, "def launch(op, env):", "    w = op.weights", "    w |= {}", "    mlp(op, env)"),
     "augmented assignment"),
])  # fmt: skip
def test_rules(source, phrase):
    problems = static_check(source)
    assert any(phrase in p for p in problems), problems


@pytest.mark.parametrize("body", ["k = _kern\n    k.cache", "f(_kern)", "return _kern"])
def test_kernels_are_only_called(body):
    source = src("import triton", "@triton.jit", "def _kern(x):", "    pass", "def f(k):", "    return k",
                 "def launch(op, env):", f"    {body}", "    _kern[(1,)](op)")  # fmt: skip
    assert any("may only be called" in p for p in static_check(source))


@pytest.mark.parametrize("source", [
    # a kernel made at run time from a closure over torch tensors: under the interpreter its torch ops would
    # run inside the (unrecorded) Triton launch
    src("import triton", MLP, "def launch(op, env):", "    a = env.buf['h']", "    def k(x):", "        a @ a",
        "    triton.jit(k)[(1,)](a)"),
    src("from triton import jit", MLP, "def launch(op, env):", "    def k(x):", "        pass", "    jit(k)[(1,)](op)"),
    src("import triton", MLP, "def launch(op, env):", "    @triton.jit", "    def k(x):", "        pass",
        "    k[(1,)](op)"),
    src("import triton", "@triton.heuristics({'B': lambda a: a['x'].sum()})", "@triton.jit",
        "def k(x, B: tl.constexpr):", "    pass", *LAUNCH_K),
])  # fmt: skip
def test_kernels_are_module_level_jit_only(source):
    assert static_check(source)


def test_what_the_allow_lists_let_through():
    """The names a legitimate launcher uses pass: dtype facts, torch.cuda device facts, PDL's gdc calls,
    config fields, tensor metadata, dict reads, the builtins of HOST_BUILTINS."""
    source = src(
        "import math",
        "import torch",
        "import triton",
        "import triton.language as tl",
        "from typing import Optional",
        MLP,
        "@triton.jit",
        "def k(x, N, BLOCK: tl.constexpr):",
        "    tl.extra.cuda.gdc_wait()",
        "    offs = tl.arange(0, BLOCK)",
        "    tl.store(x + offs, tl.load(x + offs, mask=offs < N).to(tl.float32), mask=offs < N)",
        "def launch(op, env, scale: Optional[int] = None):",
        "    x = env.buf[op.writes[0]]",
        "    top = op.attrs.get('moe').top_k if 'moe' in op.attrs else 1",
        "    n = max(1, math.ceil(x.numel() / 16)) * torch.float32.itemsize * top",
        "    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 1",
        "    k[(min(n, sms),)](x, x.numel(), BLOCK=triton.next_power_of_2(16))",
        "    mlp(op, env)",
    )
    assert static_check(source) == []


def test_kernels_use_triton_attributes_only():
    """Under the interpreter a kernel body is Python: a NumPy handle's file or ctypes methods must be out of
    reach. Every attribute the built-in kernels use on their values is allowed."""
    import ast
    from pathlib import Path

    from nonstop.tune.allowed import KERNEL_ATTRS as JIT_ATTRS

    source = src("import triton", "@triton.jit", "def k(x_ptr):", "    x_ptr.handle.data.tofile('/tmp/x')",
                 *LAUNCH_K)  # fmt: skip
    assert any("not a Triton attribute" in p for p in static_check(source))
    used = set()
    for path in (Path(__file__).resolve().parents[2] / "nonstop" / "kernels").glob("*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in fn.decorator_list):
                attrs = [n for n in ast.walk(fn) if isinstance(n, ast.Attribute)]
                used |= {n.attr for n in attrs if ast.unparse(n).split(".")[0] not in ("tl", "triton")}
    assert used <= JIT_ATTRS, used - JIT_ATTRS
