"""Gaps the mutation audit of ``nonstop/kernels/attn_tiles.py`` found: ``choose_split``'s default split count
(only the ``split_tokens`` override and a one-split short context were pinned), and the tile helpers' handling of
what a launch must ignore (masked keys, value columns past D, splits past an item's last valid one).

Expected values are derived by hand from the docstrings (choose_split) or from a plain torch softmax."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from nonstop.kernels import attn_tiles  # noqa: E402
from nonstop.kernels.attn_tiles import online_softmax_step, store_partial  # noqa: E402
from tests.kernels.test_attn_tiles import _merge_probe  # noqa: E402


@pytest.mark.parametrize(
    "context,pps,block,sms,per_sm,min_split,want",
    [
        # want = ceil(per_sm · sms / pps) = ceil(2·10/3) = 7 splits; 7 <= 32768 // 256: ceil(32768/7) = 4682 -> 4704
        (32768, 3, 32, 10, 2, 256, (4704, 7)),
        # want = 4 splits but 700 // 256 = 2 splits at most (no split under 256 keys): 350 -> 352, 2 splits
        (700, 1, 32, 2, 2, 256, (352, 2)),
        # 511 // 256 = 1 split: the whole context in one split, rounded up to the key tile
        (511, 1, 64, 8, 2, 256, (512, 1)),
        # programs_per_sm = 1: ceil(1·4/1) = 4 splits of 1000 keys
        (4000, 1, 8, 4, 1, 256, (1000, 4)),
        # 2 splits of an odd context: ceil(701 / 2) = 351 keys each (a floor, 350, would need a third split)
        (701, 1, 1, 2, 2, 256, (351, 2)),
    ],
)
def test_choose_split_default_count(context, pps, block, sms, per_sm, min_split, want, monkeypatch):
    """The default split count by hand: about ``programs_per_sm`` programs per SM, never a split under
    ``min_split`` keys, the length a multiple of ``block_s`` and the splits covering the context exactly once."""
    monkeypatch.setattr(attn_tiles, "num_sms", lambda device=None: sms)
    got = attn_tiles.choose_split(context, pps, block, "cpu", min_split=min_split, programs_per_sm=per_sm)
    assert got == want
    split, ns = got
    assert split % block == 0 and split * ns >= context and split * (ns - 1) < context
    assert ns == 1 or context // ns >= min_split - block


def test_choose_split_of_an_empty_context_is_one_split():
    """A context bound of 0 (nothing cached yet) still gives one split of one key tile, not a division by zero."""
    assert attn_tiles.choose_split(0, 1, 16, "cpu") == (16, 1)
    assert attn_tiles.choose_split(0, 1, 16, "cpu", split_tokens=5) == (16, 1)


@triton.jit
def _split_probe(
    scores_ptr,
    vis_ptr,
    v_ptr,
    ml_ptr,
    acc_ptr,
    M,
    NS,
    SPLIT,
    D,
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program ``split``: the keys [split·SPLIT, +SPLIT) of M query items in tiles of BLOCK_S keys, folded with
    online_softmax_step (+ p·V), written with store_partial. scores/vis [M, NS·SPLIT], v [NS·SPLIT, D]."""
    split = tl.program_id(0)
    m = tl.arange(0, BLOCK_M)
    mmask = m < M
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    mx = tl.zeros([BLOCK_M], dtype=tl.float32) - 1.0e30
    den = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    KEYS = NS * SPLIT
    for s0 in range(split * SPLIT, split * SPLIT + SPLIT, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        at = m[:, None] * KEYS + s[None, :]
        ms = mmask[:, None] & (s < KEYS)[None, :]
        scores = tl.load(scores_ptr + at, mask=ms, other=0.0)
        visible = tl.load(vis_ptr + at, mask=ms, other=0) != 0
        p, mx, den, acc = online_softmax_step(scores, visible, mx, den, acc)
        v = tl.load(v_ptr + s[:, None] * D + d[None, :], mask=(s < KEYS)[:, None] & dmask[None, :], other=0.0)
        acc += tl.sum(p[:, :, None] * v[None, :, :], axis=1)
    store_partial(ml_ptr, acc_ptr, m, mmask, split, NS, D, mx, den, acc, BLOCK_D)


def test_split_softmax_ignores_invisible_keys_and_value_padding():
    """7 query items over 3 splits of 8 keys (tiles of 4), D = 9 values (a 16-wide value tile), driven through
    online_softmax_step, store_partial and merge_splits against torch's softmax over each item's visible keys.

    Catches: the running max taken over masked keys (they score +80 here, far above the visible -40: the
    visible weights underflow), p not zeroed for masked keys of a row with no visible key yet (item 5 sees no key
    of its last split's first tile), a rescale of the denominator or the accumulator dropped, the partial written
    to the wrong split or with value columns >= D (they overwrite the next split's partial: the buffer is NaN
    past the partials and poisoned before the launch), and the merge of the wrong splits."""
    gen = torch.Generator().manual_seed(11)
    M, NS, SPLIT, D = 7, 3, 8, 9
    keys = NS * SPLIT
    scores = torch.randn(M, keys, generator=gen) * 3 - 40.0
    v = torch.randn(keys, D, generator=gen)
    limit = torch.tensor([1, 5, 8, 13, 24, 20, 0])  # item i sees keys < limit[i] ...
    vis = torch.arange(keys)[None, :] < limit[:, None]
    vis[5, 16:20] = False  # ... but item 5 not keys 16..19: the first tile of its last split is all masked
    scores[~vis] = 80.0  # masked keys score far above the visible ones
    n_valid = (limit + SPLIT - 1) // SPLIT
    ml = torch.full((M * NS * 2 + 64,), float("nan"))
    acc = torch.full((M * NS * D + 64,), float("nan"))  # NaN also past the last partial
    out = torch.full((M, D), float("nan"))
    _split_probe[(NS,)](scores, vis.to(torch.int32), v, ml, acc, M, NS, SPLIT, D, BLOCK_M=8, BLOCK_S=4, BLOCK_D=16)
    _merge_probe[(1,)](ml, acc, n_valid.to(torch.int32), out, M, NS, D, BLOCK_I=8, BLOCK_D=16)
    for i in range(M):
        if not vis[i].any():
            torch.testing.assert_close(out[i], torch.zeros(D))
            continue
        probs = torch.softmax(scores[i][vis[i]].double(), 0)
        want = (probs @ v[vis[i]].double()).float()
        torch.testing.assert_close(out[i], want, rtol=1e-5, atol=1e-5, msg=f"item {i}")
