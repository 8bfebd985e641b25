"""Dense super-ops (``nonstop/kernels/dense.py``, ``gemv.py``, ``attnres.py``) on operands whose rows are
padded: weight views ``big[:, :K]`` (row stride > K, unit column stride - what a checkpoint padded to a
multiple of 64 and sliced back gives) and activations that are column slices of wider buffers. The existing
tests pass contiguous weights, so a launch that passes the logical width instead of ``w.stride(0)`` (the
defect an audit found in two MoE launches) reads the padding silently.

References are plain torch from the equations (RMSNorm y = γ ⊙ x / sqrt(mean x² + eps), SwiGLU silu(g) ⊙ u,
the attention-residual mix of ``model/attnres.py``'s docstring) in fp32 on contiguous copies; every padding
holds 1e4, so any read of it is far outside the tolerance.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nonstop.kernels import attnres, dense
from nonstop.kernels.gemv import STORE, launch_gemv

PAD = 1e4


def _padded(t: torch.Tensor, pad: int) -> torch.Tensor:
    """t as a view of a buffer with ``pad`` extra columns of PAD (row stride > last dim, unit column stride)."""
    big = torch.full((*t.shape[:-1], t.shape[-1] + pad), PAD)
    big[..., : t.shape[-1]] = t
    return big[..., : t.shape[-1]]


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def test_launch_gemv_reads_a_row_padded_weight():
    """w [37, 45] a view with row stride 52: every output row must be read at w.stride(0), not K."""
    gen = torch.Generator().manual_seed(1)
    R, N, K = 3, 37, 45
    x, w = torch.randn(R, K, generator=gen), torch.randn(N, K, generator=gen)
    out = torch.full((R, N), float("nan"))
    launch_gemv(x, _padded(w, 7), out, epilogue=STORE, BLOCK_K=16, BLOCK_N=16)
    torch.testing.assert_close(out, x @ w.T, rtol=1e-5, atol=1e-4)


def test_mlp_reads_row_padded_weights_and_strided_rows():
    """Gate / up [45, 37] with row stride 42, down [37, 45] with row stride 48, x and the target column slices
    of wider buffers: catches an MLP launch that passes D / I / a contiguous width for any row stride."""
    gen = torch.Generator().manual_seed(2)
    R, D, I = 3, 37, 45
    x = torch.randn(R, D, generator=gen)
    gamma = 1 + 0.1 * torch.randn(D, generator=gen)
    wg, wu = torch.randn(I, D, generator=gen) / 6, torch.randn(I, D, generator=gen) / 6
    wd = torch.randn(D, I, generator=gen) / 6
    g, u = _rms(x, gamma, 1e-5) @ wg.T, _rms(x, gamma, 1e-5) @ wu.T
    want = (g * torch.sigmoid(g) * u) @ wd.T
    out = _padded(torch.full((R, D), float("nan")), 9)
    op = SimpleNamespace(
        reads=["x"],
        writes=["out"],
        weights={"gate": _padded(wg, 5), "up": _padded(wu, 5), "down": _padded(wd, 3), "norm": gamma},
        attrs={"eps": 1e-5, "act": "silu", "beta": 4.0, "linear_beta": 25.0},
    )
    dense.mlp(op, SimpleNamespace(buf={"x": _padded(x, 11), "out": out}))
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    assert (out.as_strided((R, 9), (out.stride(0), 1), D) == PAD).all(), "wrote past D into the padding"


def test_embed_reads_a_row_padded_table_into_a_strided_output():
    """table [50, 37] with row stride 40 and out a column slice (row stride 43): out[r] = table[ids[r]]."""
    gen = torch.Generator().manual_seed(3)
    table = torch.randn(50, 37, generator=gen)
    ids = torch.tensor([49, 0, 17])
    out = _padded(torch.full((3, 37), float("nan")), 6)
    op = SimpleNamespace(reads=["ids"], writes=["out"], weights={"embed": _padded(table, 3)})
    dense.embed(op, SimpleNamespace(buf={"ids": ids, "out": out}))
    assert torch.equal(out, table[ids])


def _attnres_reference(blocks, partial, n, w, gamma, eps):
    """x = RMSNorm(Σ_s softmax_s(⟨w, v_s⟩ / rms(v_s)) v_s) over v = blocks[:, :n] and partial (fp32)."""
    v = torch.cat([blocks[:, :n], partial[:, None]], dim=1)  # [R, n + 1, D]
    logit = (v * w).sum(-1) / torch.sqrt(v.pow(2).mean(-1) + eps)
    mix = (torch.softmax(logit, dim=-1)[..., None] * v).sum(1)
    return _rms(mix, gamma, eps)


def test_attnres_reads_padded_blocks_partial_and_out():
    """blocks [3, 3, 37] with source stride 41 and row stride 3·41 + 5, partial and out column slices, two
    completed blocks mixed and the partial stored into block 2: catches a launch that steps sources by D or
    rows by NB·D, or any row stride of partial / out taken as D."""
    gen = torch.Generator().manual_seed(5)
    R, NB, D, eps = 3, 3, 37, 1e-5
    blocks = torch.randn(R, NB, D, generator=gen)
    partial = torch.randn(R, D, generator=gen)
    w, gamma = torch.randn(D, generator=gen) / 4, 1 + 0.1 * torch.randn(D, generator=gen)
    want = _attnres_reference(blocks, partial, 2, w, gamma, eps)
    store = blocks.clone()
    store[:, 2] = partial
    big = torch.full((R, NB * (D + 4) + 5), PAD)
    padded_blocks = big.as_strided((R, NB, D), (NB * (D + 4) + 5, D + 4, 1))
    padded_blocks.copy_(blocks)
    buf = {"blocks": padded_blocks, "partial": _padded(partial, 8), "out": _padded(torch.full((R, D), 0.0), 7)}
    op = SimpleNamespace(
        writes=["out"], weights={"query": w, "norm": gamma}, attrs={"n_blocks": 2, "eps": eps, "store_block": 2}
    )
    attnres.attnres_mix_norm(op, SimpleNamespace(buf=buf))
    torch.testing.assert_close(buf["out"], want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(padded_blocks, store, rtol=0, atol=0)
    assert (big.as_strided((R, 4), (big.stride(0), 1), D) == PAD).all(), "wrote into a source's padding"


def test_mlp_and_embed_refuse_column_major_weights():
    """A transposed (column-major) gate / up or embedding table was read as row-major: the MLP's output off
    by up to 2.5 and embed's rows wrong, with no error (gemv already refused the same input). Both launches
    now raise, naming the tensor."""
    gen = torch.Generator().manual_seed(4)
    R, D, I = 2, 9, 11
    x = torch.randn(R, D, generator=gen)
    wg, wu = (torch.randn(I, D, generator=gen).t().contiguous().t() for _ in range(2))  # values [I, D], strides (1, I)
    wd = torch.randn(D, I, generator=gen)
    op = SimpleNamespace(
        reads=["x"],
        writes=["out"],
        weights={"gate": wg, "up": wu, "down": wd},
        attrs={"eps": 1e-5, "act": "silu", "beta": 4.0, "linear_beta": 25.0},
    )
    with pytest.raises(ValueError, match=r"mlp: gate needs unit column strides, got strides \(1, 11\)"):
        dense.mlp(op, SimpleNamespace(buf={"x": x, "out": torch.zeros(R, D)}))
    table = torch.randn(7, 5, generator=gen).t().contiguous().t()
    op = SimpleNamespace(reads=["ids"], writes=["out"], weights={"embed": table})
    with pytest.raises(ValueError, match="embed: embed needs unit column strides"):
        dense.embed(op, SimpleNamespace(buf={"ids": torch.tensor([1, 6]), "out": torch.zeros(2, 5)}))
