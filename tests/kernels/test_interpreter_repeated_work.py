"""``platform.interpreter_skips_repeated_work``: Triton's interpreter patches ``triton.language`` once a
launch (not again at every ``@triton.jit`` helper call), restores it when the launch ends, and maps Triton
element types to numpy dtypes exactly as its own table does."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from nonstop.kernels import launch as _launch  # noqa: E402,F401  (installs the interpreter's fixes)
from nonstop.kernels.platform import interpreter_skips_repeated_work, interpreting  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreting(), reason="the fixes are for Triton's CPU interpreter")


@triton.jit
def _add_scaled(x, s):
    return x + s * 0.5


@triton.jit
def _calls_a_helper(x_ptr, out_ptr, n, CALLS: tl.constexpr, BLOCK: tl.constexpr):
    """out = x + 0.5 · (0 + 1 + ... + CALLS-1), through CALLS helper calls."""
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0.0)
    for c in range(CALLS):
        x = _add_scaled(x, c)
    tl.store(out_ptr + i, x, mask=i < n)


def _builtin_scans(monkeypatch, calls: int) -> int:
    """How many namespace scans (``_patch_builtin``) one launch with ``calls`` helper calls makes; checks its
    output against torch and that the language is Triton's own again after the launch."""
    from triton.runtime import interpreter

    scans = []
    scan = interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda *a: scans.append(1) or scan(*a))
    x = torch.randn(13)
    out = torch.full((13,), float("nan"))
    _calls_a_helper[(1,)](x, out, 13, CALLS=calls, BLOCK=16)
    want = x.clone()
    for c in range(calls):
        want = want + c * 0.5
    assert torch.equal(out, want)
    # restored (``tl.core``'s own names may stay patched: Triton's ``tl.sort`` / ``tl.topk`` helpers see ``core``,
    # which no launch patches, and Triton leaves a helper call's patches in place)
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.where)
    assert tl.core.is_builtin(tl.tensor.__add__) and tl.core.is_builtin(tl.math.exp)
    return len(scans)


def test_helper_calls_inside_a_launch_do_not_patch_the_language_again(monkeypatch):
    assert interpreter_skips_repeated_work()  # idempotent: installed by the kernel modules already
    none, one, many = (_builtin_scans(monkeypatch, c) for c in (0, 1, 9))
    assert none > 0 and one == none and many == none


def test_a_helper_called_outside_a_launch_is_patched_as_before():
    """With the language unpatched (no launch running) the original patching still runs, so a helper called
    from plain Python sees the interpreter's builtins; Triton leaves those patches in place afterwards."""
    from triton.runtime import interpreter

    patch = interpreter._patch_lang
    scope = patch(_add_scaled.fn)
    try:
        assert not tl.core.is_builtin(tl.load)  # patched by the original
        assert scope._changes
    finally:
        scope.restore()
    assert tl.core.is_builtin(tl.load)
    assert patch.original is not patch


SCALARS = [
    tl.int1,
    tl.int8,
    tl.uint8,
    tl.int16,
    tl.uint16,
    tl.int32,
    tl.uint32,
    tl.int64,
    tl.uint64,
    tl.float16,
    tl.bfloat16,
    tl.float32,
    tl.float64,
    tl.float8e5,
    tl.float8e4nv,
    tl.float8e4b15,
]


@pytest.mark.parametrize("element", SCALARS + [tl.pointer_type(tl.float32), tl.pointer_type(tl.int8)], ids=str)
def test_dtype_lookups_equal_tritons_table(element):
    from triton.runtime import interpreter

    lookup = interpreter._get_np_dtype
    original = lookup.original
    for tt in (element, tl.block_type(element, [4]), tl.block_type(element, [2, 8])):
        for _ in range(2):  # the first lookup fills the cache, the second reads it
            assert lookup(tt) == original(tt), tt


def test_an_unknown_element_type_fails_as_in_triton():
    from triton.runtime import interpreter

    with pytest.raises(KeyError):
        interpreter._get_np_dtype.original(tl.void)
    with pytest.raises(KeyError):
        interpreter._get_np_dtype(tl.void)
    with pytest.raises(KeyError):
        interpreter._get_np_dtype(tl.block_type(tl.void, [4]))


@triton.jit
def _xor_sums(x_ptr, rows_ptr, cols_ptr, all_ptr, kept_ptr, M: tl.constexpr, N: tl.constexpr):
    """x [M, N] int32 -> xor over axis 0 [N], axis 1 [M], everything (scalar), axis 1 kept [M, 1]."""
    m = tl.arange(0, M)
    n = tl.arange(0, N)
    x = tl.load(x_ptr + m[:, None] * N + n[None, :])
    tl.store(rows_ptr + n, tl.xor_sum(x, axis=0))
    tl.store(cols_ptr + m, tl.xor_sum(x, axis=1))
    tl.store(all_ptr, tl.xor_sum(x))
    tl.store(kept_ptr + m[:, None], tl.xor_sum(x, axis=1, keep_dims=True))


def test_xor_sums_equal_a_python_fold_without_the_element_loop(monkeypatch):
    from triton.runtime import interpreter

    loops = []
    generic = interpreter.ReduceOps.generic_reduce
    monkeypatch.setattr(interpreter.ReduceOps, "generic_reduce", lambda self, i: loops.append(1) or generic(self, i))
    gen = torch.Generator().manual_seed(5)
    x = torch.randint(-(2**31), 2**31 - 1, (8, 16), generator=gen, dtype=torch.int32)
    rows, cols = torch.full((16,), -7, dtype=torch.int32), torch.full((8,), -7, dtype=torch.int32)
    every, kept = torch.full((1,), -7, dtype=torch.int32), torch.full((8,), -7, dtype=torch.int32)
    _xor_sums[(1,)](x, rows, cols, every, kept, M=8, N=16)

    def fold(values):
        out = 0
        for v in values:
            out ^= int(v)
        return out

    assert rows.tolist() == [fold(x[:, j]) for j in range(16)]
    assert cols.tolist() == [fold(x[i]) for i in range(8)] == kept.tolist()
    assert every.item() == fold(x.flatten())
    assert not loops  # no element-by-element reduce


@pytest.mark.parametrize("n", [8, 32])
def test_sort_and_topk_of_ties_equal_torch(n):
    """``tl.sort`` / ``tl.topk`` (bitonic networks of ``xor_sum`` pairings) against torch on values with ties."""

    @triton.jit
    def kernel(x_ptr, asc_ptr, desc_ptr, top_ptr, N: tl.constexpr, K: tl.constexpr):
        i = tl.arange(0, N)
        x = tl.load(x_ptr + i)
        tl.store(asc_ptr + i, tl.sort(x))
        tl.store(desc_ptr + i, tl.sort(x, descending=True))
        tl.store(top_ptr + tl.arange(0, K), tl.topk(x, K))

    gen = torch.Generator().manual_seed(n)
    x = torch.randint(-5, 6, (n,), generator=gen, dtype=torch.int32)
    asc, desc, top = (torch.full((m,), 99, dtype=torch.int32) for m in (n, n, 4))
    kernel[(1,)](x, asc, desc, top, N=n, K=4)
    assert torch.equal(asc, torch.sort(x).values)
    assert torch.equal(desc, torch.sort(x, descending=True).values)
    assert torch.equal(top, torch.topk(x, 4).values)
