"""``runtime.cpu.direct_call``: a compiled function called without torch.compile's frame machinery gives
what the function computes, and only where torch.compile's own guards would run the same graph; anything
else (another dtype, another grad mode, a size-1 dim the graph did not see) is handed back to torch.compile,
whose new graph is then called directly too."""

from __future__ import annotations

import torch

from nonstop.runtime.cpu.direct_call import CapturingInductor, DirectStep


def _step(weights: dict, x: torch.Tensor, acc: torch.Tensor, scale: int, taps: tuple = ()):
    """y = (x W + b)·scale, with acc += y in place (the step's cache writes)."""
    y = (x @ weights["w"] + weights["b"]) * scale
    acc.add_(y)
    return (y, taps)


def compile_direct(fn, backend, fullgraph: bool = True):
    """(``fn`` under torch.compile with ``backend``, no guards on its ``weights``; the DirectStep over it)."""
    step = torch.compile(
        fn,
        backend=backend,
        fullgraph=fullgraph,
        options={"guard_filter_fn": lambda entries: [not e.name.startswith("weights") for e in entries]},
    )
    return step, DirectStep(step, backend, ("weights",))


def _compiled():
    return compile_direct(_step, CapturingInductor({}))


def _args(rows: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 7, generator=g, dtype=dtype), torch.randn(rows, 5, generator=g, dtype=dtype)


def test_direct_calls_compute_the_function_and_respect_its_guards():
    torch._dynamo.reset()
    weights = {"w": torch.randn(7, 5), "b": torch.randn(5)}
    step, direct = _compiled()
    x, acc = _args(3)
    torch._dynamo.maybe_mark_dynamic(x, 0)
    torch._dynamo.maybe_mark_dynamic(acc, 0)
    assert direct(weights, x, acc, 2) is None  # nothing compiled yet
    step(weights, x, acc, 2)
    direct.learn(weights, x, acc, 2)

    for rows, seed in ((3, 1), (6, 2)):  # fresh inputs, another row count (dynamic): direct, and exact
        x, acc = _args(rows, seed=seed)
        want_acc = acc + (x @ weights["w"] + weights["b"]) * 2
        y = direct(weights, x, acc, 2)
        assert y is not None
        torch.testing.assert_close(y, (x @ weights["w"] + weights["b"]) * 2, rtol=0, atol=1e-5)
        torch.testing.assert_close(acc, want_acc, rtol=0, atol=1e-5)  # the in-place write happened

    x, acc = _args(3, seed=3)
    assert direct(weights, x, acc, 3) is None  # the int was specialised: torch.compile's guard says no
    assert direct(weights, x[:1], acc[:1], 2) is None  # one row: a size the graph was not compiled for
    with torch.enable_grad():
        assert direct(weights, x.requires_grad_(), acc, 2) is None  # global state and requires_grad guarded
    x64, acc64 = _args(4, torch.float64, seed=4)
    w64 = {k: v.double() for k, v in weights.items()}
    assert direct(w64, x64, acc64, 2) is None  # another dtype: a recompile, through torch.compile
    step(w64, x64, acc64, 2)
    direct.learn(w64, x64, acc64, 2)
    # the fixed argument is gathered once: the float64 graph was learnt with w64 and runs with it
    x64, acc64 = _args(5, torch.float64, seed=5)
    y = direct(w64, x64, acc64, 2)
    assert y is not None and y.dtype == torch.float64
    torch.testing.assert_close(y, (x64 @ w64["w"] + w64["b"]) * 2)
    torch._dynamo.reset()
