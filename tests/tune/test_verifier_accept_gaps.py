"""Adversarial observations for the verifier's judgement: each test hands ``judge_call`` /
``judge_determinism`` / ``no_op_detectable`` / ``judge_timing`` / ``judge_executor_run`` (or the
guard bands of ``state.unpack``) what a wrong or cheating candidate would produce, with values chosen by
hand, and checks that it is REJECTED (a loosened tolerance, a dropped check or a wrong comparison would
let it be accepted). The tolerances are the ones the kernel tests use (tests/kernels/harness.py)."""

from __future__ import annotations

import pytest
import torch

from nonstop.tune.exec_check import judge_executor_run
from nonstop.tune.judge import TOLERANCE, judge_call, judge_determinism, no_op_detectable
from nonstop.tune.state import GUARD, Packed, View, pack, unpack

NAN = float("nan")
X = View(0, 0, (4,), (1,), "float32")


def raw(*values: float, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).view(torch.uint8).clone()


def view_tuple(v: View) -> tuple:
    return (v.storage, v.offset, v.shape, v.stride, v.dtype)


def rec(packed: Packed, out: torch.Tensor, **extra) -> dict:
    """A clean observation: one Triton launch, every view in place, output storage 1 = ``out``."""
    views = {p: view_tuple(packed.views[i]) for p, i in packed.paths.items()}
    return {"triton_launches": 1, "views": views, "outputs": {1: out}, "guards_broken": [], "modified": [], **extra}


def one_output(out_view: View, before: torch.Tensor, after: torch.Tensor, paths=None):
    """A state of an input ``buf.x`` (storage 0) and one output storage (storage 1)."""
    views = [X, out_view] if paths is None else [X, *paths.values()]
    names = {"buf.x": 0, **({"buf.out": 1} if paths is None else {p: i + 1 for i, p in enumerate(paths)})}
    packed = Packed(b"", views, [raw(1, 2, 3, 4), before], names)
    return packed, [raw(1, 2, 3, 4), after]


# ----------------------------------------------------------------------------- tolerance


def fp32_state(want: float):
    return one_output(View(1, 0, (2,), (1,), "float32"), raw(NAN, NAN), raw(want, 5.0))


def test_fp32_tolerance_is_the_kernel_tests_one():
    """Catches a loosened (or rtol/atol swapped) fp32 tolerance: the kernel tests allow rtol 2e-4, atol 2e-5."""
    assert TOLERANCE[torch.float32] == (2e-4, 2e-5)
    assert TOLERANCE[torch.float16] == TOLERANCE[torch.bfloat16] == (2e-2, 2e-2)


def test_fp32_output_off_by_1e_4_at_0_01_is_rejected():
    """|diff| 1e-4 at a value 0.01: allowed 2e-4 * 0.01 + 2e-5 = 2.2e-5, so rejected. Catches rtol and atol
    swapped (allowing 2e-4) or a loosened fp32 tolerance."""
    packed, after = fp32_state(0.01)
    got = raw(0.0101, 5.0)
    problems = judge_call(rec(packed, got), packed, after, [1], TOLERANCE[torch.float32], "c")
    assert problems and "differ from the twin" in problems[0], problems
    ok = raw(0.01 + 1e-5, 5.0)  # 1e-5 < 2.2e-5: a right answer passes
    assert judge_call(rec(packed, ok), packed, after, [1], TOLERANCE[torch.float32], "c") == []


def test_fp16_output_off_by_0_1_is_rejected():
    """fp16 at 1.0: allowed 2e-2 * 1 + 2e-2 = 0.04; 1.1 is 0.1 away. Catches a loosened half tolerance."""
    f16 = torch.float16
    packed = Packed(
        b"",
        [X, View(1, 0, (2,), (1,), "float16")],
        [raw(1, 2, 3, 4), raw(NAN, NAN, dtype=f16)],
        {"buf.x": 0, "buf.out": 1},
    )
    after = [raw(1, 2, 3, 4), raw(1.0, 2.0, dtype=f16)]
    problems = judge_call(rec(packed, raw(1.1, 2.0, dtype=f16)), packed, after, [1], TOLERANCE[f16], "c")
    assert problems and "differ from the twin" in problems[0], problems


def test_one_wrong_element_among_right_ones_is_rejected():
    """Catches ``ok.any()`` for ``ok.all()``: the first element is right, the second far off."""
    packed, after = fp32_state(0.5)
    problems = judge_call(rec(packed, raw(0.5, 7.0)), packed, after, [1], TOLERANCE[torch.float32], "c")
    assert problems and "1 of 2 written element(s)" in problems[0], problems


def test_an_output_left_nan_is_rejected():
    """The poison left in one written element is a miss, not 'equal NaN'."""
    packed, after = fp32_state(0.5)
    problems = judge_call(rec(packed, raw(NAN, 5.0)), packed, after, [1], TOLERANCE[torch.float32], "c")
    assert problems and "NaN from the poisoned output" in problems[0], problems


def test_a_nan_the_twin_computes_is_matched_by_a_nan():
    """The twin computes a NaN (bits 0xFFC00000, not the poison's 0x7FC00000) in a written element: a launch that
    computes the same NaN is right. Catches NaN never matching NaN (a correct kernel refused)."""
    packed, _ = fp32_state(0.5)
    after = [raw(1, 2, 3, 4), raw(0.5, 5.0)]
    after[1][:4] = torch.tensor([0xFFC00000], dtype=torch.int64).to(torch.int32).view(torch.uint8)
    assert judge_call(rec(packed, after[1].clone()), packed, after, [1], TOLERANCE[torch.float32], "c") == []


def test_an_integer_output_off_by_one_is_rejected():
    """Integer outputs (token ids) must be exact: catches an integer comparison with any slack."""
    i32 = torch.int32
    packed = Packed(
        b"",
        [X, View(1, 0, (3,), (1,), "int32")],
        [raw(1, 2, 3, 4), raw(0, 0, 0, dtype=i32)],
        {"buf.x": 0, "buf.out": 1},
    )
    after = [raw(1, 2, 3, 4), raw(7, 8, 9, dtype=i32)]
    problems = judge_call(rec(packed, raw(7, 9, 9, dtype=i32)), packed, after, [1], TOLERANCE[torch.float32], "c")
    assert problems and "differ from the twin" in problems[0] and "(1,)" in problems[0], problems


def test_a_single_element_output_is_compared():
    """A one-element output (a scalar result) written wrong: catches skipping tiny outputs."""
    packed, after = one_output(View(1, 0, (1,), (1,), "float32"), raw(NAN), raw(3.0))
    problems = judge_call(rec(packed, raw(4.0)), packed, after, [1], TOLERANCE[torch.float32], "c")
    assert problems and "differ from the twin" in problems[0], problems


# ----------------------------------------------------------------------------- several views, stray bytes


def test_a_wrong_second_view_of_an_output_storage_is_rejected():
    """One output storage of 4 floats seen as two tensors (``buf.lo`` = [0:2], ``buf.hi`` = [2:4]); the launch
    is right in ``buf.lo`` and wrong in ``buf.hi``. Catches comparing only the first view of a storage."""
    paths = {"buf.lo": View(1, 0, (2,), (1,), "float32"), "buf.hi": View(1, 2, (2,), (1,), "float32")}
    packed, after = one_output(None, raw(NAN, NAN, NAN, NAN), raw(1, 2, 3, 4), paths)
    problems = judge_call(rec(packed, raw(1, 2, 3, 40)), packed, after, [1], TOLERANCE[torch.float32], "c")
    assert problems and "buf.hi" in problems[0] and "differ from the twin" in problems[0], problems


def test_bytes_before_an_offset_view_must_not_change():
    """A storage of 6 floats whose only tensor is elements [2:6]: the launch also wrote element 0, which no
    tensor covers. Catches treating an offset view as covering the whole storage."""
    out = View(1, 2, (4,), (1,), "float32")
    packed, after = one_output(out, raw(0, 0, NAN, NAN, NAN, NAN), raw(0, 0, 1, 2, 3, 4))
    problems = judge_call(rec(packed, raw(9, 0, 1, 2, 3, 4)), packed, after, [1], TOLERANCE[torch.float32], "c")
    assert any("outside the tensor" in p for p in problems), problems


def test_the_first_byte_past_a_view_must_not_change():
    """Tensor = the first 2 floats of a 3-float storage; the launch flipped the first byte of float 3 (byte 8).
    Catches a coverage map that also covers one byte past each element."""
    out = View(1, 0, (2,), (1,), "float32")
    packed, after = one_output(out, raw(NAN, NAN, 5.0), raw(1, 2, 5.0))
    got = raw(1, 2, 5.0)
    got[8] ^= 0x01
    problems = judge_call(rec(packed, got), packed, after, [1], TOLERANCE[torch.float32], "c")
    assert any("outside the tensor" in p for p in problems), problems


def test_a_strided_view_covers_only_its_elements():
    """Tensor = every other float of a 4-float storage (stride 2); the launch wrote float 1 (a gap)."""
    out = View(1, 0, (2,), (2,), "float32")
    packed, after = one_output(out, raw(NAN, 0, NAN, 0), raw(1, 0, 2, 0))
    problems = judge_call(rec(packed, raw(1, 7, 2, 0)), packed, after, [1], TOLERANCE[torch.float32], "c")
    assert any("outside the tensor" in p for p in problems), problems


def test_a_missing_output_storage_is_rejected():
    """The child's result lacks the output storage: catches dropping that problem."""
    packed, after = fp32_state(0.5)
    r = rec(packed, raw(0.5, 5.0))
    r["outputs"] = {}
    problems = judge_call(r, packed, after, [1], TOLERANCE[torch.float32], "c")
    assert problems and "output storage 1 missing" in problems[0], problems


# ----------------------------------------------------------------------------- the other rules of a call


@pytest.mark.parametrize(
    "extra,phrase",
    [
        ({"triton_launches": 0}, "no Triton kernel ran"),
        ({"guards_broken": [1]}, "guard band around buf.out changed"),
        ({"modified": [0]}, "modified an input the twin leaves as it is: buf.x"),
        ({"dirty_counters": ["k.phases"]}, "left the persistent counters k.phases nonzero"),
        ({"new_threads": 2}, "started 2 thread(s)"),
        ({"patched": ["torch.equal"]}, "replaced torch.equal"),
        ({"violations": ["torch operator aten.mm run by the candidate"]}, "aten.mm"),
        ({"error": "RuntimeError: boom"}, "launch raised RuntimeError: boom"),
    ],
)
def test_a_right_answer_with_a_broken_rule_is_rejected(extra, phrase):
    """The output is exactly the twin's, but the launch broke another rule: each rule rejects on its own
    (catches a dropped check of guard bands, modified inputs, counters, threads, patches, Triton launches)."""
    packed, after = fp32_state(0.5)
    problems = judge_call(rec(packed, after[1].clone(), **extra), packed, after, [1], TOLERANCE[torch.float32], "c")
    assert any(phrase in p for p in problems), problems


@pytest.mark.parametrize(
    "field,value",
    [(0, -1), (1, 1), (2, (1,)), (3, (2,)), (4, "int32")],
    ids=["storage", "offset", "shape", "stride", "dtype"],
)
def test_a_view_that_moved_is_rejected(field, value):
    """``buf.out`` came back as another view (other storage, offset, shape, stride or dtype): catches a view
    comparison that skips one of the five fields."""
    packed, after = fp32_state(0.5)
    r = rec(packed, after[1].clone())
    v = list(r["views"]["buf.out"])
    v[field] = value
    r["views"] = {**r["views"], "buf.out": tuple(v)}
    problems = judge_call(r, packed, after, [1], TOLERANCE[torch.float32], "c")
    assert any("buf.out is no longer the tensor it was" in p for p in problems), problems


def test_a_view_missing_from_the_result_is_rejected():
    packed, after = fp32_state(0.5)
    r = rec(packed, after[1].clone())
    del r["views"]["buf.out"]
    problems = judge_call(r, packed, after, [1], TOLERANCE[torch.float32], "c")
    assert any("buf.out is no longer the tensor it was" in p for p in problems), problems


# ----------------------------------------------------------------------------- determinism


def two_views_packed() -> Packed:
    paths = {"buf.lo": View(1, 0, (2,), (1,), "float32"), "buf.hi": View(1, 2, (2,), (1,), "float32")}
    packed, _ = one_output(None, raw(NAN, NAN, NAN, NAN), raw(1, 2, 3, 4), paths)
    return packed


def test_nondeterminism_in_the_second_view_of_a_storage_is_seen():
    """Two calls differ only in ``buf.hi`` (the storage's second tensor): catches checking only the first view."""
    packed = two_views_packed()
    first, second = {"outputs": {1: raw(1, 2, 3, 4)}}, {"outputs": {1: raw(1, 2, 3, 4.5)}}
    problems = judge_determinism(first, second, packed, "linear_residual", False, "c")
    assert problems and "buf.hi" in problems[0], problems


def test_atomic_slack_applies_on_a_gpu_only_and_is_tiny():
    """moe_experts may differ by fp32 rounding on a GPU only (rtol 1e-5): on the CPU one ulp is a failure, and on
    a GPU a 1e-3 relative difference still is. Catches the slack applied on a CPU or loosened."""
    packed = two_views_packed()
    first = {"outputs": {1: raw(1, 2, 3, 4)}}
    ulp = {"outputs": {1: raw(1, 2, 3, 4.0000005)}}
    assert judge_determinism(first, ulp, packed, "moe_experts", False, "c")
    assert judge_determinism(first, ulp, packed, "moe_experts", True, "c") == []
    far = {"outputs": {1: raw(1, 2, 3, 4.004)}}
    assert judge_determinism(first, far, packed, "moe_experts", True, "c")
    assert judge_determinism(first, ulp, packed, "linear_residual", True, "c")  # no slack for other kinds


# ----------------------------------------------------------------------------- the case's own sanity


def test_no_op_detectable_sees_a_case_a_no_op_would_fail():
    """The twin writes the output: a launch that writes nothing would fail, so the case is usable. Catches a
    wrong storage match in ``no_op_detectable`` (every case would then be refused, or none checked)."""
    packed, after = fp32_state(0.5)
    assert no_op_detectable(packed, after, [1], TOLERANCE[torch.float32])
    same = [after[0], packed.storages[1].clone()]  # a twin that writes nothing: a no-op would pass
    assert not no_op_detectable(packed, same, [1], TOLERANCE[torch.float32])


# ----------------------------------------------------------------------------- guard bands


def test_a_write_into_a_guard_band_is_seen():
    """Unpack a state, change one byte just before and (on a copy) just after a storage: ``guard_intact`` says so.
    Catches guard bands that are not written or not compared in full."""
    packed = pack({"buf": {"x": torch.tensor([1.0, 2.0, 3.0, 4.0])}})
    for where in (GUARD - 1, GUARD + 16, 0, GUARD + 16 + GUARD - 1):
        u = unpack(packed, "cpu", torch.Generator().manual_seed(3))
        assert u.guard_intact(0)
        u.padded[0][where] ^= 0xFF
        assert not u.guard_intact(0), where
    u = unpack(packed, "cpu", torch.Generator().manual_seed(3))
    assert torch.equal(u.body(0), packed.storages[0])
    assert u.padded[0][:GUARD].ne(0).any()  # random bytes, not zeros a kernel could rewrite unnoticed


# ----------------------------------------------------------------------------- the executor run


REF = [torch.tensor([[1.0, -2.0, 0.5]])]
PLANNED = {"job": {"B": 1, "T": 1, "fingerprint": "f", "tuned_calls": 3}, "reference": REF}
BUILTIN = {"fingerprint": "f", "logits": [REF[0] + 0.01]}


@pytest.mark.parametrize("extra", [{"new_threads": 1}, {"patched": ["time.perf_counter"]}])
def test_an_executor_run_with_threads_or_patches_is_rejected(extra):
    """Right logits, but the executor run started a thread / replaced a function: catches a dropped check."""
    got = {"tuned_calls": 3, "logits": list(REF), **extra}
    (msg,) = judge_executor_run(PLANNED, BUILTIN, got, TOLERANCE[torch.float32])
    assert "replaced" in msg, msg


def test_an_executor_run_that_never_used_the_candidate_is_rejected():
    """Right logits (the built-in ran) but the stored candidate ran 0 times: catches a dropped count check."""
    got = {"tuned_calls": 0, "logits": list(REF)}
    (msg,) = judge_executor_run(PLANNED, BUILTIN, got, TOLERANCE[torch.float32])
    assert "0 of 3 times" in msg, msg


def test_executor_logits_ten_times_the_builtin_deviation_are_rejected():
    """Built-in off by 0.01: bound 4 * 0.01 + 2e-4 * 2 + 2e-5 = 0.04042; the candidate off by 0.1 is rejected.
    Catches a loosened deviation factor."""
    got = {"tuned_calls": 3, "logits": [REF[0] + 0.1]}
    (msg,) = judge_executor_run(PLANNED, BUILTIN, got, TOLERANCE[torch.float32])
    assert "logits differ" in msg, msg
