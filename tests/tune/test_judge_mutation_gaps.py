"""The parent's judgement of one call (``judge.judge_call`` / ``compare_output`` / ``judge_determinism``) on
hand-made observations: a state of two float32 storages (an input ``buf.x`` and an output ``buf.out``),
values chosen by hand, so each rule is seen to reject on its own."""

from __future__ import annotations

import torch

from nonstop.tune.judge import compare_output, judge_call, judge_determinism
from nonstop.tune.state import Packed, View

TOL = (2e-4, 2e-5)
X = View(0, 0, (4,), (1,), "float32")
OUT = View(1, 0, (4,), (1,), "float32")


def raw(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).view(torch.uint8).clone()


def state() -> tuple[Packed, list[torch.Tensor]]:
    """Input [1, 2, 3, 4]; output poisoned [NaN] * 4; the twin writes out[:2] = [10, 20], leaves out[2:]."""
    nan = float("nan")
    packed = Packed(b"", [X, OUT], [raw(1, 2, 3, 4), raw(nan, nan, nan, nan)], {"buf.x": 0, "buf.out": 1})
    after = [raw(1, 2, 3, 4), raw(10, 20, nan, nan)]
    return packed, after


def rec(out: torch.Tensor, **extra) -> dict:
    views = {"buf.x": (0, 0, (4,), (1,), "float32"), "buf.out": (1, 0, (4,), (1,), "float32")}
    return {"triton_launches": 1, "views": views, "outputs": {1: out}, "guards_broken": [], "modified": [], **extra}


def test_a_right_call_passes():
    packed, after = state()
    assert judge_call(rec(after[1].clone()), packed, after, [1], TOL, "c") == []


def test_an_element_the_twin_leaves_alone_must_stay_as_it_was():
    packed, after = state()
    got = raw(10, 20, 7, float("nan"))  # out[2] was NaN before and after the twin
    problems = judge_call(rec(got), packed, after, [1], TOL, "c")
    assert problems and "changed 1 element(s) that the twin leaves as they are (first at (2,))" in problems[0]
    assert compare_output("buf.out", OUT, packed.storages[1], after[1], got, TOL)


def test_a_patched_harness_function_is_a_problem():
    packed, after = state()
    problems = judge_call(rec(after[1].clone(), patched=["time.perf_counter"]), packed, after, [1], TOL, "c")
    assert any("replaced time.perf_counter" in p for p in problems), problems


def test_a_started_thread_is_a_problem():
    packed, after = state()
    problems = judge_call(rec(after[1].clone(), new_threads=1), packed, after, [1], TOL, "c")
    assert any("started 1 thread(s)" in p for p in problems), problems


def test_a_replaced_output_tensor_is_a_problem():
    """The launch swapped buf.out for a tensor of its own (storage -1: not one of the state's)."""
    packed, after = state()
    r = rec(after[1].clone())
    r["views"] = {**r["views"], "buf.out": (-1, 0, (4,), (1,), "float32")}
    problems = judge_call(r, packed, after, [1], TOL, "c")
    assert any("buf.out is no longer the tensor it was" in p for p in problems), problems


def test_bytes_outside_every_view_of_an_output_storage_must_not_change():
    """A storage of 6 floats whose only tensor is its first 4: the twin writes [10, 20]; the launch also
    wrote the 6th float, which no tensor covers."""
    nan = float("nan")
    out = View(1, 0, (4,), (1,), "float32")
    packed = Packed(b"", [X, out], [raw(1, 2, 3, 4), raw(nan, nan, nan, nan, 5, 6)], {"buf.x": 0, "buf.out": 1})
    after = [raw(1, 2, 3, 4), raw(10, 20, nan, nan, 5, 6)]
    problems = judge_call(rec(raw(10, 20, nan, nan, 5, 99)), packed, after, [1], TOL, "c")
    assert any("outside the tensor" in p for p in problems), problems


def test_two_calls_on_one_state_must_give_the_same_bytes_on_a_cpu():
    packed, _ = state()
    first = {"outputs": {1: raw(10, 20, 0, 0)}}
    second = {"outputs": {1: raw(10, 20.000002, 0, 0)}}  # one ulp-ish apart: within any tolerance, not bitwise
    problems = judge_determinism(first, second, packed, "moe_experts", False, "c")
    assert problems and "not deterministic" in problems[0] and "(1,)" in problems[0]
