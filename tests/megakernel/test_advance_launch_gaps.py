"""``advance.launch`` (the launch the executors and the megakernel's recording use) for steps of several
tokens a sequence, and the ``advance`` kernel on a token log whose rows are not packed. Expected values
come from plain loops over the documented rule:

    ids[b·T + t] = next_ids[b·T + t]; sample_offset[b·T + t] += T; start[b] += T;
    token_log[b, (start[b] + T) mod LOG] = next_ids[b·T + T - 1]   (every other log entry unchanged)
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from nonstop.runtime.megakernel import advance  # noqa: E402
from nonstop.runtime.megakernel.advance import LOG, advance_kernel  # noqa: E402


def expected(next_ids, ids, start, log, offset, B, T):
    """The rule above, one element at a time (on copies)."""
    ids, start, log, offset = ids.clone(), start.clone(), log.clone(), offset.clone()
    for b in range(B):
        for t in range(T):
            ids[b * T + t] = next_ids[b * T + t]
            offset[b * T + t] += T
        log[b, (int(start[b]) + T) % LOG] = next_ids[b * T + T - 1]
        start[b] += T
    return ids, start, log, offset


@pytest.mark.parametrize("B,T", [(2, 3), (1, 5), (3, 6)])
def test_launch_advances_every_row_of_a_multi_token_step(B, T):
    """``launch`` sizes the kernel's row block from T: a block narrower than T (e.g. half of
    ``next_power_of_2(T)``) would leave the last rows' ``ids`` and ``sample_offset`` of each sequence
    unadvanced for T = 3, 5, 6."""
    g = torch.Generator().manual_seed(B * 10 + T)
    next_ids = torch.randint(0, 1000, (B * T,), generator=g)
    ids = torch.randint(-(2**40), 2**40, (B * T,), generator=g)  # junk
    start = torch.randint(0, 3 * LOG, (B,), generator=g)
    log = torch.randint(-(2**40), 2**40, (B * T, LOG), generator=g)  # one row per step row, as allocated
    offset = torch.randint(0, 2**40, (B * T,), generator=g)
    want = expected(next_ids, ids, start, log, offset, B, T)

    buf = {"next_ids": next_ids, "ids": ids, "token_log": log, "sample_offset": offset}
    env = SimpleNamespace(B=B, T=T, buf=buf, batch=SimpleNamespace(start=start))
    advance.launch(advance.advance_op(), env)
    for name, got, w in zip(("ids", "start", "token_log", "sample_offset"), (ids, start, log, offset), want):
        assert torch.equal(got, w), name


def test_kernel_follows_the_token_log_row_stride():
    """The kernel addresses sequence b's log row by the stride it is given, not by LOG: a log whose rows
    are padded (a view of a wider tensor) gets each token in its own row and leaves the padding alone."""
    B, T = 3, 2
    g = torch.Generator().manual_seed(7)
    next_ids = torch.randint(0, 1000, (B * T,), generator=g)
    ids = torch.zeros(B * T, dtype=torch.int64)
    start = torch.tensor([5, LOG - 2, 2 * LOG + 1])  # the middle one wraps around the ring
    wide = torch.full((B, LOG + 9), -7, dtype=torch.int64)
    log = wide[:, :LOG]
    offset = torch.zeros(B * T, dtype=torch.int64)
    want = expected(next_ids, ids, start, log, offset, B, T)

    advance_kernel[(B,)](next_ids, ids, start, log, log.stride(0), offset, T, LOG=LOG, BLOCK_T=2)
    assert torch.equal(log, want[2]) and torch.equal(start, want[1])
    assert (wide[:, LOG:] == -7).all()
    for b in range(B):  # by hand: the last token of each sequence at position start + T
        assert log[b, (int(want[1][b])) % LOG] == next_ids[b * T + T - 1]
