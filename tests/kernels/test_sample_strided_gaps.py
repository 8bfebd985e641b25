"""The ``sample`` kernel (``nonstop/kernels/sample.py``) on logits whose rows are padded (``logits.stride(0) >
V``: a view ``big[:, :V]`` of a wider buffer, as a vocabulary padded to a multiple of 64 would give). Every
existing sample test passes ``.contiguous()`` logits, so a phase that indexes rows by V instead of the row
stride reads the neighbouring row's padding unnoticed.

Expected tokens come from the twin (``REFERENCE["sample"]``, torch sorts + ``model/philox``) on a contiguous
copy; the padding holds +60, far above every real logit, so any read of it changes the pick.
"""

from __future__ import annotations

import torch

from nonstop.kernels.sample import KERNELS, sample_op, sample_paths
from nonstop.program.reference import REFERENCE, StepEnv
from tests.kernels.test_sample import _env as sample_env


def _env(logits: torch.Tensor, params, seeds, offsets) -> StepEnv:
    """test_sample's buffers, with ``logits`` kept as given (its strides too)."""
    env = sample_env(logits, params, seeds, offsets)
    env.buf["logits"] = logits
    return env


def _padded(rows: torch.Tensor, pad: int) -> torch.Tensor:
    R, V = rows.shape
    big = torch.full((R, V + pad), 60.0)
    big[:, :V] = rows
    view = big[:, :V]
    assert view.stride(0) == V + pad
    return view


def _check(rows: torch.Tensor, params, seeds, offsets, **kw) -> list[int]:
    V = rows.shape[1]
    op, _ = sample_op(V)
    want = _env(rows.contiguous(), params, seeds, offsets)
    REFERENCE["sample"](op, want)
    got = _env(_padded(rows, 13), params, seeds, offsets)
    KERNELS["sample"](op, got, **kw)
    assert got.buf["next_ids"].tolist() == want.buf["next_ids"].tolist()
    return sample_paths("cpu", len(params))[: len(params)].tolist()


def test_row_padded_logits_every_mode():
    """Greedy, plain, top-k, top-p and both over an odd vocabulary (203: four chunks of 64, the last ragged)
    with the rows 13 entries apart in memory: catches a scan, verify or pick phase that steps rows by V (or
    a launcher that passes V for ``logits.stride(0)``)."""
    gen = torch.Generator().manual_seed(11)
    params = [(0.0, -1, 1.0), (1.0, -1, 1.0), (0.8, 7, 1.0), (1.2, -1, 0.7), (1.0, 20, 0.9), (2.0, 3, 0.5)]
    rows = torch.randn(len(params), 203, generator=gen) * 2.0
    _check(rows, params, torch.arange(len(params)) * 13 + 1, torch.arange(len(params)) * 3, chunk=64)


def test_row_padded_logits_one_program_search():
    """Top-k 3 with two candidates a chunk and one scorer on rows with a bump of 10 equal-ish values: most
    rows are decided by the one-program search over the whole row, which must step rows by the row stride
    too."""
    gen = torch.Generator().manual_seed(4)
    R, V = 4, 301
    row = torch.randn(V, generator=gen) * 0.05
    row[:10] += 0.3
    rows = row.expand(R, -1).contiguous()
    params = [(1.0, 3, 1.0)] * R
    paths = _check(rows, params, 77, torch.arange(R), chunk=64, candidates=2, scorers=1, search_quads=16)
    assert 3 in paths, paths


def test_row_padded_logits_verified_scorers():
    """Flat rows under top-p 0.9 with two candidates a chunk: the merged lists cannot hold the kept set, so the
    draw comes from the verified scorers (path 2), whose sums the verify phase reads from the row. A verify
    phase stepping rows by V reads the padding (+60): its sums then rule the scorers out and the row falls
    back to the search - the same token, but not the same path as the contiguous launch, which it must match."""
    gen = torch.Generator().manual_seed(6)
    R, V = 4, 203
    rows = torch.randn(R, V, generator=gen) * 0.1
    params = [(1.0, -1, 0.9)] * R
    kw = dict(chunk=64, candidates=2, scorers=4)
    seeds, offsets = torch.arange(R) * 5 + 2, torch.arange(R)
    op, _ = sample_op(V)
    plain = _env(rows.contiguous(), params, seeds, offsets)
    KERNELS["sample"](op, plain, **kw)
    plain_paths = sample_paths("cpu", R)[:R].tolist()
    assert 2 in plain_paths[1:], plain_paths
    assert _check(rows, params, seeds, offsets, **kw) == plain_paths
