"""Candidates a red team wrote that passed the rules (static_check, and verify() under TRITON_INTERPRET=1 on the
tiny llama linear_residual target) while doing what the rules exist to stop; each is refused now.

1. str(tensor) reads every value on the host unseen (Tensor.__repr__ disables the torch modes): host compute.
2. A @triton.jit function called directly (not launched) from host code runs, under the interpreter, as plain
   Python on host objects (no plain_launch_args, augmented assignment allowed): a call counter in op.attrs.
3. A tensor launched into a tl.constexpr parameter reaches the kernel body as the torch tensor; torch runs
   there unrecorded (Recorder ignores everything while _in_triton).
4. torch.Tensor bound to a local, then called: uninitialised memory (the torch.Tensor(n) rule checks the
   literal call only).
5. A value read laundered through a nonstop.kernels helper (pow2 -> int(tensor)) is "trusted".
"""

from __future__ import annotations

import pytest

from nonstop.tune.static_check import static_check

LR = "from nonstop.kernels.dense import linear_residual as builtin"


def src(*lines: str) -> str:
    return "\n".join(lines) + "\n"


HOST_READ_STR = src(
    LR,
    "def launch(op, env):",
    "    text = str(env.buf[op.reads[0]])",  # every value, on the host, without a recorded operator
    "    if '12345' not in text:",
    "        builtin(op, env)",
)

DIRECT_CALL_COUNTER = src(
    "import triton",
    "import triton.language as tl",  # the interpreter wants tl visible from the jit function's globals
    LR,
    "@triton.jit",
    "def _merge(table, extra):",
    "    table |= extra",
    "def launch(op, env):",
    "    n = op.attrs.get('calls', 0)",
    "    _merge(op.attrs, {'calls': n + 1})",
    "    if n < 50:",
    "        builtin(op, env)",
)

TORCH_IN_CONSTEXPR = src(
    "import triton",
    "import triton.language as tl",
    "@triton.jit",
    "def _k(out_ptr, stride_out, A: tl.constexpr, W: tl.constexpr, B: tl.constexpr, ACC: tl.constexpr):",
    "    y = (A[:, None, :] * W[None, :, :]).sum(2)",
    "    if B is not None:",
    "        y = y + B",
    "    for r in range(y.shape[0]):",
    "        for n in range(y.shape[1]):",
    "            p = out_ptr + r * stride_out + n",
    "            v = float(y[r, n])",
    "            if ACC:",
    "                v = v + tl.load(p)",
    "            tl.store(p, v)",
    "def launch(op, env):",
    "    a, out, w = env.buf[op.reads[0]], env.buf[op.writes[0]], op.weights['w']",
    "    _k[(1,)](out, out.stride(0), A=a, W=w, B=op.weights.get('b'), ACC=op.attrs.get('accumulate', False))",
)

TENSOR_ALIAS = src(
    "import torch",
    "import triton",
    "import triton.language as tl",
    LR,
    "@triton.jit",
    "def _k(p):",
    "    tl.store(p, tl.load(p + 9) + 1)",
    "def launch(op, env):",
    "    alloc = torch.Tensor",
    "    box = alloc(64)",
    "    _k[(1,)](box)",
    "    builtin(op, env)",
)

HELPER_READ = src(
    LR,
    "from nonstop.kernels.platform import pow2",
    "def launch(op, env):",
    "    if pow2(env.buf[op.reads[0]].select(0, 0).select(0, 0)) < 1 << 20:",
    "        builtin(op, env)",
)


# ------------------------------------------------------------------ static refusals (fast)


def test_direct_call_of_a_triton_kernel_from_host_code_is_refused():
    """Host code may launch a file's kernel (k[grid](...)), never call it: under TRITON_INTERPRET=1
    the call runs the body as host Python on raw objects (op.attrs |= ... keeps a call counter)."""
    problems = static_check(DIRECT_CALL_COUNTER)
    assert any("_merge" in p for p in problems), problems


def test_torch_tensor_bound_to_a_name_is_refused():
    """torch.Tensor is a type for isinstance only; any other use (an alias that is then called,
    tl.constexpr(torch.Tensor)(n), [torch.Tensor][0](n)) allocates uninitialised memory."""
    problems = static_check(TENSOR_ALIAS)
    assert any("torch.Tensor" in p for p in problems), problems


# ------------------------------------------------------------------ dynamic refusals (about 10-15 s each)


def _verify(source):
    from nonstop.tune.verify import verify
    from tests.tune.helpers import tiny_target

    return verify(source, tiny_target("linear_residual"), timeout_s=240)


@pytest.mark.parametrize(
    "source, phrase",
    [
        (HOST_READ_STR, "host"),  # Tensor.__repr__ reads values with the torch modes off
        (HELPER_READ, "host"),  # a read inside a nonstop.kernels helper
        (TORCH_IN_CONSTEXPR, "tensor for its constexpr parameter A"),  # torch on it in the kernel body
        (DIRECT_CALL_COUNTER, ""),  # refused statically (the rule above)
    ],
    ids=["str_of_tensor", "helper_int_read", "tensor_constexpr", "direct_kernel_call"],
)
def test_red_team_candidates_are_rejected(source, phrase):
    verdict = _verify(source)
    assert not verdict.accepted, "accepted"
    assert any(phrase in r for r in verdict.reasons), verdict.reasons
