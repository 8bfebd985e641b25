"""Contracts of the C++ CPU kernels (``runtime/cpu/gemv.cpp``, ``attention.cpp``, ``isa.h``) that the packed
weights never exercise but a direct ``torch.ops.nonstop_cpu`` caller relies on: inconsistent shapes are
refused (not read out of bounds), a negative ISA level means the scalar path, and the attention kernel's
``n = min(visible, L)`` and grouped-head rule. Expected values come from plain float64 torch."""

from __future__ import annotations

import pytest
import torch

from nonstop.runtime.cpu.kernels import load_kernels
from nonstop.runtime.cpu.packed import tile_rows

KERNELS_MISSING = load_kernels(progress=False)
pytestmark = pytest.mark.skipif(KERNELS_MISSING is not None, reason=f"C++ kernels unavailable: {KERNELS_MISSING}")


def _weights(N: int, K: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, K, generator=g), torch.randn(2, K, generator=g)


def test_gemv_refuses_x_whose_width_disagrees_with_the_tiles():
    w, x = _weights(7, 37)
    tiles = tile_rows(w, 16)  # [8, 48]: K = 37 padded to 48
    torch.testing.assert_close(torch.ops.nonstop_cpu.linear_f32(x, tiles, 7), x @ w.t(), rtol=1e-5, atol=1e-5)
    for k in (20, 32, 49):  # a whole chunk short, exactly one chunk short, wider than the tiles
        with pytest.raises(RuntimeError, match="disagree on K"):
            torch.ops.nonstop_cpu.linear_f32(torch.randn(2, k), tiles, 7)


def test_gemv_refuses_a_row_count_the_tiles_do_not_hold():
    w, x = _weights(7, 37)
    tiles = tile_rows(w, 16)  # 8 rows: n must be 5..8
    for n in (4, 9, 0):
        with pytest.raises(RuntimeError, match="row count"):
            torch.ops.nonstop_cpu.linear_f32(x, tiles, n)


def test_int8_gemv_refuses_scale_groups_that_split_a_chunk():
    q = tile_rows(torch.randint(-127, 128, (4, 48), dtype=torch.int8), 16)  # 3 chunks of 16 columns
    x = torch.randn(1, 48)
    s = torch.rand(4, 2) + 0.5  # 2 groups of 1.5 chunks each
    with pytest.raises(RuntimeError, match="G dividing"):
        torch.ops.nonstop_cpu.linear_int8(x, q, s, 4)


def test_a_negative_isa_level_runs_the_scalar_path():
    best = torch.ops.nonstop_cpu.limit_isa(9)
    w, x = _weights(9, 70, seed=1)
    try:
        assert torch.ops.nonstop_cpu.limit_isa(-1) == 0
        assert torch.ops.nonstop_cpu.isa_level() == 0
        got = torch.ops.nonstop_cpu.linear_f32(x, tile_rows(w, 16), 9)
        got_bf16 = torch.ops.nonstop_cpu.linear_bf16(x, tile_rows(w.bfloat16(), 32), 9)
    finally:
        torch.ops.nonstop_cpu.limit_isa(best)
    want = (x.double() @ w.double().t()).float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    want_bf16 = (x.double() @ w.bfloat16().double().t()).float()
    torch.testing.assert_close(got_bf16, want_bf16, rtol=1e-5, atol=1e-4)


def _attention(q, k, v, rows, n, scale):
    """Plain float64 softmax attention of each query over its first n[b] pool rows (grouped heads)."""
    B, H, _ = q.shape
    R = H // k.shape[1]
    out = torch.empty(B, H, v.shape[2], dtype=torch.float64)
    for b in range(B):
        r = rows[b, : n[b]]
        for h in range(H):
            p = torch.softmax(k[r, h // R].double() @ q[b, h].double() * scale, 0)
            out[b, h] = p @ v[r, h // R].double()
    return out.float()


def _qkv(g, B, H, Hkv, D, Dv, P):
    """Queries [B, H, D] and a pool of P rows of keys [P, Hkv, D] / values [P, Hkv, Dv], all N(0, 1)."""
    return torch.randn(B, H, D, generator=g), torch.randn(P, Hkv, D, generator=g), torch.randn(P, Hkv, Dv, generator=g)


def test_attention_reads_at_most_the_L_rows_it_is_given():
    """visible past L (n = min(visible, L)): each query sees exactly its own L rows, not the next sequence's
    (rows [B, L] is contiguous, so reading past L would take the next sequence's rows as extra keys)."""
    g = torch.Generator().manual_seed(5)
    B, H, Hkv, D, Dv, L, P = 3, 4, 2, 16, 40, 17, 64
    q, k, v = _qkv(g, B, H, Hkv, D, Dv, P)
    rows = torch.stack([torch.randperm(P, generator=g)[:L] for _ in range(B)])
    read = torch.zeros(P, dtype=torch.bool)
    read[rows.reshape(-1)] = True
    k[~read], v[~read] = float("nan"), float("nan")
    visible = torch.tensor([L + 2, L + 1, L])
    got = torch.ops.nonstop_cpu.decode_attention(q, k, v, rows, visible, D**-0.5)
    assert bool(torch.isfinite(got).all())
    torch.testing.assert_close(got, _attention(q, k, v, rows, [L, L, L], D**-0.5), rtol=1e-5, atol=1e-5)


def test_attention_refuses_query_heads_that_key_heads_do_not_divide():
    g = torch.Generator().manual_seed(6)
    q, k, v = torch.randn(1, 6, 8, generator=g), torch.randn(5, 4, 8, generator=g), torch.randn(5, 4, 8, generator=g)
    rows, visible = torch.arange(5)[None], torch.tensor([5])
    with pytest.raises(RuntimeError, match="Hkv dividing H"):
        torch.ops.nonstop_cpu.decode_attention(q, k, v, rows, visible, 1.0)


def test_attention_refuses_an_outside_row_at_the_last_visible_position_and_a_batch_mismatch():
    g = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(2, 4, 8, generator=g), torch.randn(9, 2, 8, generator=g), torch.randn(9, 2, 8, generator=g)
    rows, visible = torch.stack([torch.randperm(9, generator=g)[:6] for _ in range(2)]), torch.tensor([6, 4])
    bad = rows.clone()
    bad[1, 3] = 9  # the last key sequence 1 sees
    with pytest.raises(RuntimeError, match="outside the pool"):
        torch.ops.nonstop_cpu.decode_attention(q, k, v, bad, visible, 1.0)
    bad[1, 3], bad[1, 4] = rows[1, 3], 9  # past what it sees: stale, never read
    torch.ops.nonstop_cpu.decode_attention(q, k, v, bad, visible, 1.0)
    with pytest.raises(RuntimeError, match="disagree on B"):
        torch.ops.nonstop_cpu.decode_attention(q, k, v, torch.cat([rows, rows[:1]]), visible, 1.0)
    with pytest.raises(RuntimeError, match="k must be"):  # keys wider than the queries
        torch.ops.nonstop_cpu.decode_attention(q, torch.randn(9, 2, 12), v, rows, visible, 1.0)


def test_attention_softmax_survives_scores_far_above_the_first_keys():
    """Scores spread over hundreds (a large scale): the softmax must subtract the row's maximum, not the
    first key's score, or e^(score - first) overflows."""
    g = torch.Generator().manual_seed(8)
    B, H, Hkv, D, Dv, L, P = 1, 2, 1, 16, 8, 9, 12
    q, k, v = _qkv(g, B, H, Hkv, D, Dv, P)
    rows = torch.randperm(P, generator=g)[:L][None]
    k[rows[0, 0]] = -q[0, 0] / q[0, 0].norm()  # the first key scores lowest for head 0
    k[rows[0, 5]] = q[0, 0] / q[0, 0].norm()
    scale = 50.0
    got = torch.ops.nonstop_cpu.decode_attention(q, k, v, rows, torch.tensor([L]), scale)
    assert bool(torch.isfinite(got).all())
    # scores of about ±200 in fp32: each carries ~1e-5 of rounding, so the weights agree to ~1e-4
    torch.testing.assert_close(got, _attention(q, k, v, rows, [L], scale), rtol=1e-3, atol=1e-3)
