"""The ``sample`` kernel's one-program search (``nonstop/kernels/sample.py``, path 3) over an odd vocabulary
whose kept set sits at the very end of the row: the last entry (index V - 1, in a ragged last quad and chunk)
must be a candidate like any other. The existing search test puts its bump at the start of the row, so a mask
that drops the last entry of the row's last block goes unnoticed.

Expected tokens: the twin (``REFERENCE["sample"]``: torch top-k / top-p + ``model/philox`` Gumbel noise).
"""

from __future__ import annotations

import torch

from nonstop.kernels.sample import KERNELS, sample_op, sample_paths
from nonstop.program.reference import REFERENCE, StepEnv


def _env(logits: torch.Tensor, top_k: int, offsets: torch.Tensor) -> StepEnv:
    R = logits.shape[0]
    return StepEnv(
        {
            "logits": logits.clone(),
            "sample_temperature": torch.ones(R),
            "sample_top_k": torch.full((R,), top_k, dtype=torch.int64),
            "sample_top_p": torch.ones(R),
            "sample_seed": torch.full((R,), 41, dtype=torch.int64),
            "sample_offset": offsets.clone(),
            "next_ids": torch.full((R,), -1, dtype=torch.int64),
        },
        None,
        None,
    )


def test_search_keeps_the_last_entry_of_an_odd_vocabulary():
    """V = 301 (75 quads and one entry), top-k 3 with the three largest values at indices 298..300 (the last
    the largest) over a flat row, two candidates a chunk and one scorer: most rows take the search, and
    about a third of the draws must be the last entry 300."""
    gen = torch.Generator().manual_seed(8)
    R, V = 12, 301
    row = torch.randn(V, generator=gen) * 0.05
    row[V - 3 :] = torch.tensor([0.40, 0.45, 0.50])
    logits = row.expand(R, -1).contiguous()
    offsets = torch.arange(R) * 3
    op, _ = sample_op(V)
    want, got = _env(logits, 3, offsets), _env(logits, 3, offsets)
    REFERENCE["sample"](op, want)
    KERNELS["sample"](op, got, chunk=64, candidates=2, scorers=1, search_quads=16)
    assert V - 1 in want.buf["next_ids"].tolist()
    assert got.buf["next_ids"].tolist() == want.buf["next_ids"].tolist()
    assert 3 in sample_paths("cpu", R)[:R].tolist()


def test_every_mode_can_pick_the_last_entry():
    """V = 203 (a ragged last chunk), the last entry 30 above every other logit: greedy takes it, and every
    sampled mode must too - Philox Gumbel noise lies in [-log(-log 2^-24), -log(-log(1 - 2^-24))] ≈ [-2.8,
    16.6], so no other entry can outscore it (hand arithmetic, no reference needed)."""
    gen = torch.Generator().manual_seed(9)
    V = 203
    params = [(0.0, -1, 1.0), (1.0, -1, 1.0), (1.0, 5, 1.0), (1.0, -1, 0.9), (0.7, 20, 0.8)]
    R = len(params)
    logits = torch.randn(R, V, generator=gen)
    logits[:, V - 1] = 30.0 + logits.max()
    env = _env(logits, -1, torch.arange(R))
    env.buf["sample_temperature"] = torch.tensor([p[0] for p in params])
    env.buf["sample_top_k"] = torch.tensor([p[1] for p in params], dtype=torch.int64)
    env.buf["sample_top_p"] = torch.tensor([p[2] for p in params])
    op, _ = sample_op(V)
    KERNELS["sample"](op, env)
    assert env.buf["next_ids"].tolist() == [V - 1] * R


def test_greedy_takes_the_first_of_equal_maxima_in_one_chunk():
    """Greedy (temperature 0) with the row's maximum at indices 10 and 20 of the same chunk and at 150 of
    another: argmax is the first maximal index, 10 (the ``sample`` contract; torch.argmax agrees)."""
    V = 203
    logits = torch.zeros(2, V)
    logits[:, [10, 20, 150]] = 5.0
    env = _env(logits, -1, torch.zeros(2, dtype=torch.int64))
    env.buf["sample_temperature"] = torch.zeros(2)
    op, _ = sample_op(V)
    KERNELS["sample"](op, env)
    assert env.buf["next_ids"].tolist() == [10, 10]
