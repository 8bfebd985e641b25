"""The C++ one-token paged attention kernel (``runtime/cpu/attention.cpp``) against the model's own
attention (``model.attention.gqa_attention``) on keys gathered from the pool, and the ``cpu`` executor
routing a Llama's decode steps through it with the reference's tokens (compiled: called directly, its
dynamic sizes handed to inductor's C++ wrapper as kept tensors, ``direct_call.DirectStep``)."""

from __future__ import annotations

import pytest
import torch

from nonstop.model.attention import gqa_attention
from nonstop.runtime.cpu import CPUExecutor
from nonstop.runtime.cpu.kernels import load_kernels
from nonstop.runtime.cpu.ops import CPU_KERNEL_OPS, gqa_attn_decode
from nonstop.runtime.executors import ReferenceExecutor
from tests.runtime.helpers import greedy_tokens, tiny_model

KERNELS_MISSING = load_kernels(progress=False)
needs_kernels = pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")


def _case(B, H, Hkv, D, Dv, L, P, seed):
    """Fresh q, pools with NaN in every row no query may read, rows [B, L] and visible [B] (1..L)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, D, generator=g)
    k = torch.randn(P, Hkv, D, generator=g) * 2
    v = torch.randn(P, Hkv, Dv, generator=g)
    rows = torch.stack([torch.randperm(P, generator=g)[:L] for _ in range(B)])
    visible = torch.randint(1, L + 1, (B,), generator=g)
    visible[0] = L
    read = torch.zeros(P, dtype=torch.bool)
    for b in range(B):
        read[rows[b, : visible[b]]] = True
    k[~read], v[~read] = float("nan"), float("nan")  # rows past a query's position hold stale data
    return q, k, v, rows, visible


@needs_kernels
@pytest.mark.parametrize("isa", [2, 1, 0], ids=["avx512", "avx2", "scalar"])
@pytest.mark.parametrize(
    "B,H,Hkv,D,Dv,L,P", [(1, 6, 2, 20, 20, 13, 29), (3, 5, 5, 17, 9, 7, 40), (2, 12, 3, 64, 64, 97, 130)]
)
def test_kernel_equals_the_models_attention_on_gathered_rows(B, H, Hkv, D, Dv, L, P, isa):
    q, k, v, rows, visible = _case(B, H, Hkv, D, Dv, L, P, seed=B * 100 + L + isa)
    scale = D**-0.5
    mask = torch.arange(L)[None, None, :] < visible[:, None, None]  # [B, 1, L]
    want = gqa_attention(q[:, None], torch.nan_to_num(k[rows]), torch.nan_to_num(v[rows]), mask, scale)[:, 0]
    best = torch.ops.nonstop_cpu.limit_isa(9)
    try:
        torch.ops.nonstop_cpu.limit_isa(isa)
        got = torch.ops.nonstop_cpu.decode_attention(q, k, v, rows, visible, scale)
    finally:
        torch.ops.nonstop_cpu.limit_isa(best)
    assert got.shape == (B, H, Dv) and bool(torch.isfinite(got).all())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_kernel_refuses_rows_outside_the_pool_and_queries_without_keys():
    q, k, v, rows, visible = _case(1, 4, 2, 8, 8, 5, 9, seed=3)
    bad = rows.clone()
    bad[0, 0] = 9
    with pytest.raises(RuntimeError, match="outside the pool"):
        torch.ops.nonstop_cpu.decode_attention(q, k, v, bad, visible, 1.0)
    with pytest.raises(RuntimeError, match="at least one key"):
        torch.ops.nonstop_cpu.decode_attention(q, k, v, rows, torch.zeros(1, dtype=torch.long), 1.0)


@needs_kernels
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_llama_decode_runs_the_kernel_and_gives_the_reference_tokens(compile, monkeypatch):
    calls = []

    def counted(op, env):
        calls.append(env.T)
        return gqa_attn_decode(op, env)

    monkeypatch.setitem(CPU_KERNEL_OPS, "gqa_attn", counted)
    model = tiny_model("llama")
    ex = CPUExecutor(model, compile=compile, progress=False)
    assert ex.table is CPU_KERNEL_OPS
    want = greedy_tokens(model, ReferenceExecutor(model))
    assert greedy_tokens(model, ex) == want  # three sequences at different positions decoded together
    assert calls and set(calls) == {1}  # decode steps only (prefill runs the reference)
    if compile:  # called directly, the dynamic sizes (pool rows, context length) handed over as kept 0-d tensors
        assert ex.stats["direct_steps"] > 0 and ex._direct.sizes
        assert all(t.dim() == 0 and t.dtype == torch.long and int(t) == n for n, t in ex._direct.sizes.items())
