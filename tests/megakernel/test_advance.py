"""The megakernel's ``advance`` kernel against its plain-torch twin (fresh random inputs, odd shapes,
junk in every output before the launch)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from nonstop.runtime.megakernel.advance import LOG, advance_kernel, advance_twin  # noqa: E402


@pytest.mark.parametrize("B,T,seed", [(1, 1, 0), (3, 1, 1), (3, 5, 2), (5, 3, 3)])
def testadvance_kernel_matches_its_twin(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    next_ids = torch.randint(0, 1000, (B * T,), generator=g)
    start = torch.randint(0, 3 * LOG, (B,), generator=g)  # wraps around the ring
    ids = torch.randint(-(2**40), 2**40, (B * T,), generator=g)  # junk
    log = torch.randint(-(2**40), 2**40, (B * T, LOG), generator=g)  # junk; one row per step row, B used
    offset = torch.randint(0, 2**40, (B * T,), generator=g)

    want_ids, want_start, want_log, want_offset = ids.clone(), start.clone(), log.clone(), offset.clone()
    advance_twin(next_ids, want_ids, want_start, want_log, T, want_offset)
    assert torch.equal(want_offset, offset + T)

    block_t = 1 << (T - 1).bit_length()
    advance_kernel[(B,)](next_ids, ids, start, log, log.stride(0), offset, T, LOG=LOG, BLOCK_T=block_t)
    assert torch.equal(offset, want_offset)
    assert torch.equal(ids, next_ids) and torch.equal(ids, want_ids)
    assert torch.equal(start, want_start)
    assert torch.equal(log, want_log)
