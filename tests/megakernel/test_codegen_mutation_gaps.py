"""Gaps a mutation audit of the megakernel's code generator found: constexpr dtypes written into the generated
source name the same dtype back, and a pointer that is 8 but not 16 bytes aligned gets no ``tl.multiple_of(.., 16)``
hint (the GPU compiler would vectorise a load on an address it does not hold)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

tl = pytest.importorskip("triton.language")

from nonstop.runtime.megakernel import advance  # noqa: E402
from nonstop.runtime.megakernel.codegen.plan import build_plan  # noqa: E402
from nonstop.runtime.megakernel.codegen.record import LaunchRecorder  # noqa: E402
from nonstop.runtime.megakernel.codegen.source import TORCH_TO_TL, const_literal  # noqa: E402


def test_constexpr_literals_read_back_as_the_same_value():
    dtypes = [tl.float32, tl.float16, tl.bfloat16, tl.float64, tl.float8e4nv, tl.float8e5, tl.int8, tl.int32, tl.int64]
    for d in dtypes:
        assert eval(const_literal(d), {"tl": tl}) == d, (d, const_literal(d))
    for value in (None, True, False, 0, -3, 2**40, 1.5, 1e-6, "silu"):
        assert eval(const_literal(value)) == value and type(eval(const_literal(value))) is type(value)
    for torch_dtype, text in TORCH_TO_TL.items():  # the pointer element types name the same width and kind
        d = eval(text, {"tl": tl})
        assert d.primitive_bitwidth == torch.empty(0, dtype=torch_dtype).element_size() * 8 or torch_dtype == torch.bool
        assert d.is_floating() == torch_dtype.is_floating_point, torch_dtype


def test_a_pointer_off_16_byte_alignment_gets_no_alignment_hint():
    """``ids`` is a view 8 bytes into its storage (aligned to 8, not 16); ``next_ids`` starts its own storage."""
    B, T = 2, 1
    storage = torch.zeros(8, dtype=torch.int64)
    buf = {
        "next_ids": torch.zeros(B * T, dtype=torch.int64),
        "ids": storage[1 : 1 + B * T],
        "token_log": torch.zeros(B, advance.LOG, dtype=torch.int64),
        "sample_offset": torch.zeros(B * T, dtype=torch.int64),
    }
    assert buf["ids"].data_ptr() % 16 == 8 and buf["next_ids"].data_ptr() % 16 == 0
    env = SimpleNamespace(T=T, B=B, buf=buf, batch=SimpleNamespace(start=torch.zeros(B, dtype=torch.int32)))
    with LaunchRecorder() as rec:
        advance.launch(None, env)
    plan = build_plan([rec.launches], "cpu")
    pointers = {p.name: p.align16 for cls in plan.classes for p in cls.params if p.kind == "ptr"}
    assert pointers["ids_ptr"] is False and pointers["next_ids_ptr"] is True, pointers
