"""Gaps in ``runtime.cpu.direct_call`` the existing test leaves open: how ``CapturingInductor`` records a graph
(its inputs' sources, its output count), which graphs ``DirectStep.learn`` refuses (several outputs, a graph
break), and the C++-wrapper convention (every int the graph takes arrives as a 0-d int64 tensor, one kept per
value). A recording backend stands in for inductor, so no C++ is compiled: it sees exactly what a direct
call hands the graph, and runs the traced graph eagerly."""

from __future__ import annotations

import torch

from nonstop.runtime.cpu.direct_call import CapturingInductor
from tests.runtime.test_cpu_direct_call import compile_direct


class Recording(CapturingInductor):
    """``CapturingInductor`` with inductor replaced by the traced graph run eagerly; ``calls`` records the
    inputs of every call of a compiled graph (0-d tensors at int positions turned back into ints to run)."""

    def __init__(self, cpp_wrapper: bool):
        self.cpp_wrapper = cpp_wrapper
        self.captured = []
        self.calls: list[tuple] = []

        def inner(gm, example_inputs):
            ints = {i for i, e in enumerate(example_inputs) if isinstance(e, (int, torch.SymInt))}
            dtypes = [e.dtype if isinstance(e, torch.Tensor) else None for e in example_inputs]

            def fn(*inputs):
                self.calls.append((ints, inputs))
                for a, dtype in zip(inputs, dtypes):  # as a compiled kernel, which assumes its inputs' dtypes
                    assert dtype is None or a.dtype == dtype, "a graph called with inputs of another dtype"
                return gm(*[int(a) if i in ints and isinstance(a, torch.Tensor) else a for i, a in enumerate(inputs)])

            return fn

        self.inner = inner


def _step(weights: dict, x: torch.Tensor, acc: torch.Tensor, scale: int):
    y = (x @ weights["w"] + weights["b"]) * scale
    acc.add_(y)
    return (y,)


def _two_outputs(weights: dict, x: torch.Tensor, acc: torch.Tensor, scale: int):
    y = (x @ weights["w"] + weights["b"]) * scale
    return (y, y + 1)


def _broken(weights: dict, x: torch.Tensor, acc: torch.Tensor, scale: int):
    y = x @ weights["w"]
    torch._dynamo.graph_break()
    return ((y + weights["b"]) * scale,)


def _args(rows: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x, acc = torch.randn(rows, 7, generator=g), torch.randn(rows, 5, generator=g)
    torch._dynamo.maybe_mark_dynamic(x, 0)
    torch._dynamo.maybe_mark_dynamic(acc, 0)
    return x, acc


def _weights():
    g = torch.Generator().manual_seed(9)
    return {"w": torch.randn(7, 5, generator=g), "b": torch.randn(5, generator=g)}


def test_the_backend_records_sources_and_the_output_count():
    """A placeholder without a dynamo source is recorded as None (so ``learn`` refuses the graph), and the
    output count is the tuple's length, -1 for a bare value: a mutation that records any other source or
    count would let ``learn`` call graphs whose inputs it cannot gather or whose first output is not all."""
    backend = CapturingInductor({})
    backend.inner = lambda gm, example_inputs: gm.forward  # no inductor: only the recording is under test
    backend(torch.fx.symbolic_trace(lambda a: (a + 1, a * 2)), [torch.ones(2)])
    backend(torch.fx.symbolic_trace(lambda a: a + 1), [torch.ones(2)])
    assert [c.sources for c in backend.captured] == [[None], [None]]
    assert [c.outputs for c in backend.captured] == [2, -1]
    assert CapturingInductor({}).cpp_wrapper is False and CapturingInductor({"cpp_wrapper": True}).cpp_wrapper


def test_a_graph_with_two_outputs_or_a_graph_break_stays_with_torchcompile_direct():
    """``learn`` keeps only a single graph whose only output is the step's: a graph of two outputs (the
    direct call returns just the first) or the first of two graphs (a graph break: it computes part of the
    function) must never be called directly."""
    torch._dynamo.reset()
    weights = _weights()
    for fn, fullgraph in ((_two_outputs, True), (_broken, False)):
        step, direct = compile_direct(fn, Recording(False), fullgraph)
        x, acc = _args(3, 0)
        step(weights, x, acc, 2)
        direct.learn(weights, x, acc, 2)
        x, acc = _args(3, 1)
        assert direct(weights, x, acc, 2) is None, fn.__name__
    torch._dynamo.reset()


def _learnt(cpp_wrapper: bool, before_learn=None):
    """(weights, the recording backend, the DirectStep) once ``_step`` ran and was learnt at 3 rows;
    ``before_learn(backend)`` may change what the backend captured first."""
    torch._dynamo.reset()
    weights = _weights()
    backend = Recording(cpp_wrapper)
    step, direct = compile_direct(_step, backend)
    x, acc = _args(3, 0)
    step(weights, x, acc, 2)
    if before_learn is not None:
        before_learn(backend)
    direct.learn(weights, x, acc, 2)
    assert len(backend.captured) == 1
    backend.calls.clear()
    return weights, backend, direct


def test_a_cpp_wrapper_graph_takes_its_ints_as_kept_0d_tensors():
    """Inductor's C++ wrapper takes a dynamic size as a 0-d int64 tensor: a direct call must hand over one
    (the value, dtype int64, no dims), the same tensor object every time the value recurs, and the right
    result; a Python wrapper takes the ints as they are."""
    weights, backend, direct = _learnt(cpp_wrapper=True)
    kept = {}
    for rows, seed in ((4, 1), (6, 2), (4, 3)):
        x, acc = _args(rows, seed)
        want_acc = acc + (x @ weights["w"] + weights["b"]) * 2
        y = direct(weights, x, acc, 2)
        assert y is not None
        torch.testing.assert_close(y, (x @ weights["w"] + weights["b"]) * 2)
        torch.testing.assert_close(acc, want_acc)
        ints, inputs = backend.calls[-1]
        assert ints, "the graph takes the row count as an int"
        for i in ints:
            t = inputs[i]
            assert isinstance(t, torch.Tensor) and t.dim() == 0 and t.dtype == torch.int64 and int(t) == rows
            assert kept.setdefault((i, rows), t) is t  # kept per value: no fresh tensor per call
    weights, backend, direct = _learnt(cpp_wrapper=False)
    x, acc = _args(5, 4)
    assert direct(weights, x, acc, 2) is not None
    ints, inputs = backend.calls[-1]
    assert ints and all(type(inputs[i]) is int and inputs[i] == 5 for i in ints)
    torch._dynamo.reset()


def test_kept_size_tensors_are_one_per_value_and_bounded():
    """``_size`` keeps one 0-d tensor per value (a fresh ``torch.tensor`` per call is what it exists to avoid)
    and forgets them all once more than 4096 values were seen (a long run sees many context lengths)."""
    _, _, direct = _learnt(cpp_wrapper=True)
    direct.sizes.clear()
    first = direct._size(7)
    assert direct._size(8) is not first and direct._size(7) is first
    assert int(first) == 7 and first.dtype == torch.int64 and first.dim() == 0
    for v in range(100, 100 + 4095):
        direct._size(v)
    assert len(direct.sizes) == 4097 and direct._size(7) is first  # 4097 values kept, 7 among them
    direct._size(99)  # one more: the table is cleared first
    assert len(direct.sizes) == 1 and direct._size(7) is not first
    torch._dynamo.reset()


def test_a_graph_with_a_sourceless_input_stays_with_torchcompile_direct():
    """An input without a source cannot be gathered from the arguments: ``learn`` must leave such a graph to
    torch.compile (quietly), not fail on it or call it with a wrong input."""

    def drop_a_source(backend) -> None:  # as CapturingInductor records a placeholder dynamo gave no source
        backend.captured[-1].sources[-1] = None

    weights, _, direct = _learnt(False, before_learn=drop_a_source)
    x, acc = _args(3, 1)
    assert direct(weights, x, acc, 2) is None
    torch._dynamo.reset()


def test_the_fixed_arguments_are_gathered_once_at_learning():
    """``fixed`` arguments (the weights) are read once, when the graph is learnt, and not gathered per call
    (the saving ``DirectStep`` exists for): a call passing other weight tensors of the same shapes (which the
    filtered guards accept) still computes with the learnt ones, the other arguments are read afresh."""
    weights, backend, direct = _learnt(cpp_wrapper=False)
    other = {k: v + 1 for k, v in weights.items()}
    x, acc = _args(3, 5)
    y = direct(other, x, acc, 2)
    assert y is not None
    torch.testing.assert_close(y, (x @ weights["w"] + weights["b"]) * 2)
    torch._dynamo.reset()


def test_graphs_compiled_before_learning_are_never_matched_to_the_wrong_entry():
    """Two graphs compiled without a ``learn`` in between (fp32, then fp64 arguments): a later ``learn`` for the
    fp32 arguments cannot tell which new graph is whose and must learn neither; taking the newest graph (the
    fp64 one) for the fp32 entry would run a kernel compiled for other dtypes."""
    torch._dynamo.reset()
    weights = _weights()
    w64 = {k: v.double() for k, v in weights.items()}
    step, direct = compile_direct(_step, Recording(False))
    x, acc = _args(3, 0)
    step(weights, x, acc, 2)
    step(w64, x.double(), acc.double(), 2)
    direct.learn(weights, x, acc, 2)
    x, acc = _args(3, 1)
    y = direct(weights, x, acc, 2)
    assert y is None or torch.allclose(y, (x @ weights["w"] + weights["b"]) * 2)
    torch._dynamo.reset()
