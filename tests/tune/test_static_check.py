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


@pytest.mark.parametrize("source,phrase", [
    ("def launch(op, env):\n    return (\n", "syntax error at line"),
    ("import torch as T\nfrom nonstop.kernels.common import mlp\ndef launch(op, env):\n    T.mm(op, env)\n", "torch.mm"),
    ("from torch import cuda\nfrom nonstop.kernels.common import mlp\ndef launch(op, env):\n    cuda.synchronize()\n", "from torch import cuda"),
    ("import triton\nfrom nonstop.kernels.common import mlp\ndef launch(op, env):\n    triton.runtime.driver.active.get_current_stream()\n", "triton.runtime"),
    ("import triton.language as tl\nimport triton\n@triton.jit\ndef k(x):\n    tl.inline_asm_elementwise('', '', [x], dtype=tl.int32, is_pure=True, pack=1)\n"
     "def launch(op, env):\n    k[(1,)](op)\n", "inline_asm_elementwise"),
    ("import torch\nimport triton\n@triton.jit\ndef k(x):\n    torch.ones(1)\ndef launch(op, env):\n    k[(1,)](op)\n", "torch inside the Triton kernel"),
    ("import triton\ndef helper(x):\n    return x\n@triton.jit\ndef k(x):\n    helper(x)\ndef launch(op, env):\n    k[(1,)](op)\n", "may only use Triton functions"),
    ("from nonstop.kernels.common import mlp\ndef launch(op, env):\n    env.buf.update({})\n    mlp(op, env)\n", ".update"),
    ("from nonstop.kernels.common import mlp\ndef launch(op, env):\n    x = env.buf['h']\n    x.data_ptr()\n    mlp(op, env)\n", ".data_ptr"),
    ("from nonstop.kernels.common import mlp\ndef launch(op, env):\n    mlp.fn.__globals__\n", "dunder"),
    ("from nonstop.kernels.common import mlp\ndef launch(op, env):\n    f = lambda: 0\n    f.__code__\n", "dunder"),
    ("from nonstop.kernels.common import mlp\nlaunch = mlp\nlaunch.cache = {}\n", "module-level"),
    ("from nonstop.kernels.common import _WORKSPACES\nfrom nonstop.kernels.common import mlp as launch\n", "mutable container"),
    ("from nonstop.kernels.common import mlp\ndef launch(op):\n    mlp(op, None)\n", "launch(op, env)"),
    ("import triton\n@triton.jit\ndef launch(op, env):\n    pass\n", "not a Triton kernel"),
    ("import math\n", "no launch(op, env)"),
    ("from nonstop.kernels.common import mlp\nasync def launch(op, env):\n    mlp(op, env)\n", "async"),
    ("from nonstop.kernels.common import mlp\ndef launch(op, env):\n    global X\n    mlp(op, env)\n", "global"),
    ("from nonstop.kernels.common import mlp\ndef launch(op, env):\n    import os\n    mlp(op, env)\n", "imports inside functions"),
    ("from nonstop.kernels.common import mlp\ndef launch(op, env):\n    g = op.weights.get\n    g.__self__\n", "dunder"),
    ("from nonstop.kernels.common import mlp\ndef launch(op, env):\n    e = SystemExit\n", "SystemExit"),
])
def test_rules(source, phrase):
    problems = static_check(source)
    assert any(phrase in p for p in problems), problems
