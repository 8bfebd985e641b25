"""``codegen.record``: what a recorded launch holds, which grids are refused, and which of an op's weights
count as streamed weights or side streams (the split the offline check and the weight-pointer table use).
Expected values are the arguments passed by hand and byte counts worked out from the shapes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from nonstop.runtime.megakernel.codegen.record import LaunchRecorder, weight_roles  # noqa: E402


@triton.jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def test_launches_are_recorded_by_parameter_and_not_run():
    """A [3]-program launch is recorded with its arguments by name and its launch options apart; nothing
    runs (y stays zero); an empty grid records nothing; a callable grid is refused with a clear error, not
    dropped silently (its op would then have no tiles in the megakernel)."""
    x, y = torch.arange(8.0), torch.zeros(8)
    with LaunchRecorder() as rec:
        _copy[(3,)](x, y, 8, BLOCK=4, num_warps=2)
        _copy[(0,)](x, y, 0, BLOCK=4)
        with pytest.raises(ValueError, match="callable grids cannot be recorded"):
            _copy[lambda meta: (2,)](x, y, 8, BLOCK=4)
    assert not y.any()
    (la,) = rec.launches
    assert la.grid == 3 and la.name == "_copy" and la.options == {"num_warps": 2}
    assert list(la.args) == ["x_ptr", "y_ptr", "n", "BLOCK"]
    assert la.args["x_ptr"] is x and la.args["y_ptr"] is y and la.args["n"] == 8 and la.args["BLOCK"] == 4
    _copy[(2,)](x, y, 8, BLOCK=4)  # the patch is gone after the block: launches run again
    assert torch.equal(y, x)


def test_weight_roles_split_by_size_against_the_largest_weight():
    """Largest 2-d weight 64x32 fp16 = 4096 bytes. Streamed: at least a quarter (1024 bytes, the 32x16 fp16
    boundary included); side streams: at least 1/32 (128 bytes, boundary included) but under a quarter;
    neither: smaller ones (127 bytes) and 1-d vectors however large. Catches moved thresholds, a strict
    comparison at a boundary, vectors counted as weights, and side streams that also count as streamed."""
    w = {
        "big": torch.zeros(64, 32, dtype=torch.float16),  # 4096
        "quarter": torch.zeros(32, 16, dtype=torch.float16),  # 1024: streamed
        "under_quarter": torch.zeros(1023, 1, dtype=torch.uint8),  # 1023: side
        "scale": torch.zeros(64, 4, dtype=torch.uint8),  # 256: side
        "thirty_second": torch.zeros(32, 4, dtype=torch.uint8),  # 128: side
        "tiny": torch.zeros(127, 1, dtype=torch.uint8),  # 127: neither
        "norm": torch.zeros(4096, dtype=torch.float32),  # a vector: neither
    }
    streamed, side = weight_roles(SimpleNamespace(weights=w))

    def names(storages):
        return {n for n, t in w.items() if t.untyped_storage()._cdata in storages}

    assert names(streamed) == {"big", "quarter"}
    assert names(side) == {"under_quarter", "scale", "thirty_second"}
    assert weight_roles(SimpleNamespace(weights={"norm": w["norm"]})) == (set(), set())


def test_mxfp4_expert_launches_know_their_packed_weights_and_scales():
    """The MXFP4 experts launch of a tiny K3: the packed expert matrices are its streamed weights and their
    scales ride along as side streams (what the weight-pointer table and the offline GPU check read).
    Catches the two sets swapped or merged."""
    from tests.megakernel.kernel_steps import kernel_step

    ks = kernel_step("kimi_k3_mxfp4", B=1, T=1)
    op, launches = next((op, ls) for op, ls in zip(ks.ops, ks.launches) if op.kind == "moe_experts")
    (la,) = launches

    def role(arg):
        st = la.args[arg].untyped_storage()._cdata
        return next(
            r for r, t in op.weights.items() if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata == st
        )

    assert {a: role(a) for a in la.weights} == {
        "w1_ptr": "w1_packed",
        "w2_ptr": "w2_packed",
        "w3_ptr": "w3_packed",
    }
    assert {a: role(a) for a in la.side} == {
        "s1_ptr": "w1_scale",
        "s2_ptr": "w2_scale",
        "s3_ptr": "w3_scale",
    }
