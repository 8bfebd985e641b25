"""Static rules that no other test pins: each source below breaks exactly one rule of ``static_check``
(the comment says which) and must be refused for it; the last test documents a known hole."""

from __future__ import annotations

import pytest

from nonstop.tune.static_check import MAX_SOURCE, static_check

LR = "from nonstop.kernels.dense import linear_residual"
KERNEL = ["import triton", "@triton.jit", "def k(x):", "    pass"]


def src(*lines: str) -> str:
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "source,phrase",
    [
        # a dunder name in host code: __builtins__ is the builtins dict, .get("exec") would run anything
        (src(LR, "def launch(op, env):", "    __builtins__.get('exec')('1')", "    linear_residual(op, env)"),
         "'__builtins__' is not allowed"),
        # a private attribute at module level (host and kernel code have their own attribute lists)
        (src(LR + " as launch", "X = launch._private"), "private or dunder attribute ._private"),
        # frame / code introspection at module level
        (src(LR + " as launch", "X = launch.f_globals"), "frame / code introspection"),
        # a module-level call that is not tl.constexpr(...): it would run at import
        (src(LR + " as launch", "X = launch(None, None)"), "must be a constant"),
        # triton.jit takes literal arguments only
        (src("import triton", "@triton.jit(repr=lambda *a: 0)", "def k(x):", "    pass", LR,
             "def launch(op, env):", "    k[(1,)](op)", "    linear_residual(op, env)"),
         "takes constant arguments only"),
        # module-level statements other than imports, functions and constants
        (src(LR + " as launch", "for i in range(2):", "    pass"), "module-level For"),
        (src(LR + " as launch", "if True:", "    Y = 1"), "module-level If"),
        # item assignment: a candidate does not replace the tensors of the objects it gets
        (src(LR, "def launch(op, env):", "    env.buf['h'] = env.buf['x']", "    linear_residual(op, env)"),
         "assignment to env.buf['h']"),
        # attribute access on a module-level constant, even with an attribute host code may read elsewhere
        (src(LR, "N = 4", "def launch(op, env):", "    b = N.bit_length()", "    linear_residual(op, env)"),
         "attribute access on N"),
        # launch must be callable as launch(op, env): a third required parameter is refused statically
        (src(LR, "def launch(op, env, extra):", "    linear_residual(op, env)"), "launch(op, env)"),
        # no Triton kernel at all
        (src("def launch(op, env):", "    pass"), "no Triton kernel"),
        # decorators on nested functions
        (src(LR, "def launch(op, env):", "    @(lambda f: f)", "    def g():", "        pass",
             "    linear_residual(op, env)"),
         "decorators on the nested function g"),
        # a Triton kernel of nonstop.kernels imported as launch
        (src("from nonstop.kernels.dense import embed_tile as launch"), "launch must be a Python launcher function"),
    ],
)  # fmt: skip
def test_rule(source, phrase):
    problems = static_check(source)
    assert any(phrase in p for p in problems), problems


def test_a_file_over_the_size_limit_is_refused():
    body = src(LR + " as launch")
    assert static_check(body) == []
    padded = "#" + "x" * MAX_SOURCE + "\n" + body
    problems = static_check(padded)
    assert problems and f"at most {MAX_SOURCE}" in problems[0], problems


@pytest.mark.parametrize(
    "source",
    [
        # a module-level constant read off an imported function: cdiv.get_capture_scope() is a module's
        # globals, and ["__builtins__"]["exec"] runs anything (in the child, and once stored in the server)
        src(
            "from triton import cdiv",
            LR,
            "SCOPE = cdiv.get_capture_scope",
            "def launch(op, env):",
            "    SCOPE().get('__builtins__').get('exec')('1')",
            "    linear_residual(op, env)",
        ),
        # the same chain in a module-level annotation, evaluated at import
        src("from triton import cdiv", LR + " as launch", "X: cdiv.get_capture_scope().get('x') = 1"),
        # a call that only ends in .constexpr is no tl.constexpr
        src("from triton import cdiv", LR + " as launch", "X = cdiv.get_capture_scope.constexpr(1)"),
        # a kernel's hooks outlive a call (a call counter), read at module level or in host code
        src(*KERNEL, LR, "HOOKS = k.pre_run_hooks", "def launch(op, env):", "    linear_residual(op, env)"),
        src(*KERNEL, LR, "def launch(op, env):", "    k.add_pre_run_hook(len)", "    linear_residual(op, env)"),
        # an imported path followed by anything, in host code
        src("from triton import cdiv", LR, "def launch(op, env):", "    cdiv.fn", "    linear_residual(op, env)"),
    ],
)
def test_attribute_chains_off_imported_objects_and_kernels_are_refused(source):
    """Each of these passed the rules (a candidate that wrote a file and opened a raw socket from the
    verification child was accepted); the attribute chains are now held to the allow-list."""
    assert static_check(source)


@pytest.mark.parametrize(
    "line",
    ["X = tl.constexpr(4)", "DT = tl.float32", "W = torch.bfloat16.itemsize", "N: int = 3", "M: tl.constexpr = 2"],
)
def test_allowed_module_level_constants_still_pass(line):
    source = src("import torch", "import triton.language as tl", LR + " as launch", line)
    assert static_check(source) == []


@pytest.mark.parametrize(
    "source, phrase",
    [
        # a class pattern reads any attribute by name (dict(update=u), torch.Tensor(untyped_storage=s))
        (
            src(LR, "def launch(op, env):", "    match op.attrs:", "        case dict(update=u):", "            pass"),
            "match statements",
        ),
        # a comprehension variable named like a builtin made the builtin a "known" name in the whole function
        (
            src(LR, "def launch(op, env):", "    x = [0 for iter in range(1)]", "    linear_residual(op, env)"),
            "binds the builtin name 'iter'",
        ),
        (src(LR, "def launch(op, env, map=None):", "    linear_residual(op, env)"), "binds the builtin name 'map'"),
        # the legacy constructor allocates uninitialised memory
        (
            src("import torch", LR, "def launch(op, env):", "    t = torch.Tensor(64)", "    linear_residual(op, env)"),
            "torch.Tensor is allowed only as a type",
        ),
        (
            src("from torch import Tensor", LR, "def launch(op, env):", "    t = Tensor(64)", "    launch(op, env)"),
            "torch.Tensor is allowed only as a type",
        ),
        # a Triton kernel as launch: under the interpreter its body would run as unchecked host code
        (src(*KERNEL, "launch = k"), "not a Triton kernel"),
    ],
)
def test_red_team_escapes_are_refused(source, phrase):
    problems = static_check(source)
    assert any(phrase in p for p in problems), problems


def test_torch_tensor_is_still_a_type_for_isinstance():
    source = src(
        "import torch",
        LR,
        "def launch(op, env):",
        "    if isinstance(env.buf[op.writes[0]], torch.Tensor):",
        "        linear_residual(op, env)",
    )
    assert static_check(source) == []


def test_a_dict_of_constants_in_nonstop_kernels_is_not_importable(monkeypatch):
    """A dict table (even of constants) is state a kernel could change in place: tables are tuples or
    read-only mappings."""
    from types import MappingProxyType

    from nonstop.kernels import moe

    monkeypatch.setattr(moe, "TABLE_FOR_TEST", {"n": 64}, raising=False)
    problems = static_check(src("from nonstop.kernels.moe import TABLE_FOR_TEST", LR + " as launch"))
    assert any("a mutable container" in p for p in problems), problems
    monkeypatch.setattr(moe, "TABLE_FOR_TEST", MappingProxyType({"n": 64}), raising=False)
    assert static_check(src("from nonstop.kernels.moe import TABLE_FOR_TEST", LR + " as launch")) == []


def test_a_kernel_binding_a_builtins_name_is_refused():
    """Under the interpreter a kernel body runs as Python: a comprehension variable named iter made iter a
    "known" name in the kernel, reaching the real builtin elsewhere in it."""
    source = src(
        "import triton",
        "@triton.jit",
        "def k(x):",
        "    y = [0 for iter in range(1)]",
        LR + " as launch",
    )
    problems = static_check(source)
    assert any("k binds the builtin name 'iter'" in p for p in problems), problems
