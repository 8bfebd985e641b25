"""``choose_exchange``'s cost comparison at magnitudes where each term of the documented byte model shows in
the reason it prints (``nonstop program`` shows it): the static buffers' int32 slot header, one buffer per
chunk, redundant copies of an expert on one rank counting once, and the split sizes going to E - 1 peers.
Expected figures are hand arithmetic from the module docstring's model (GLOO_CPU: 300 us per peer,
0.85 GB/s)."""

from __future__ import annotations

from types import SimpleNamespace

from nonstop.dist import ExpertPlacement
from nonstop.dist.exchange import choose_exchange


def _op(placement: ExpertPlacement, k: int, chunks: int) -> SimpleNamespace:
    attrs = dict(placement=placement, ep_ranks=placement.ranks, ep_rank=0, tp_ranks=1, tp_rank=0, rank=0)
    attrs.update(world=placement.ranks, top_k=k, chunks=chunks, max_local=placement.max_local)
    return SimpleNamespace(kind="moe_ep", attrs=attrs)


def test_header_bytes_and_duplicate_copies_in_the_padding():
    """Catches the static buffers' 4-byte slot header left out of their bytes, and a rank's second copy of
    an expert counted as another expert it holds. Experts 0, 0, 1 on rank 0 and 2 on rank 1, top-3, one
    chunk, 10^6 rows per rank, 4-byte rows. Static: rank 0 sends rank 1 (one distinct expert) 10^6 rows,
    rank 1 sends rank 0 (two distinct experts) 2·10^6, each row 2·4 + 4 bytes: 3.6e7 bytes. Dynamic: 10^6·3·1/3
    + 10^6·3·2/3 = 3·10^6 remote pairs, 8 bytes each way: 2.4e7. Padding per rank: 1.2e7 / 2 / 0.85e9 s =
    7059 us; saved: the split-size all-to-all, 300 us + 1·3 int32 (12 bytes) = 300 us."""
    op = _op(ExpertPlacement(3, ((0, 0, 1), (2,))), k=3, chunks=1)
    mode, reason = choose_exchange("auto", [op], (10**6, 10**6), 10**7, "cpu", False, 4)
    assert mode == "dynamic"
    assert reason.startswith("static padding 7059 us >= dynamic split-size exchanges and host reads 300 us per step")


def test_every_chunk_sends_its_buffers_and_sizes_go_to_the_other_ranks():
    """Catches the static bytes counted for one chunk only, and the split sizes counted for E peers instead
    of E - 1. Two experts, one per rank, top-1, 1000 chunks, one row per rank, 4-byte rows. Static: each
    rank sends its peer a 1-row buffer per chunk: 2 · 1000 · 12 = 24000 bytes. Dynamic: 2 · 1/2 pairs of 8
    bytes = 8. Padding per rank: 23992 / 2 / 0.85e9 s = 14 us; saved: the split-size all-to-all to the one
    peer, 300 us + 1 · 1000 · 1 · 4 bytes (4.7 us) = 305 us."""
    op = _op(ExpertPlacement.even(2, 2), k=1, chunks=1000)
    mode, reason = choose_exchange("auto", [op], (1, 1), 16, "cpu", False, 4)
    assert mode == "static"
    assert reason.startswith("static padding 14 us < dynamic split-size exchanges and host reads 305 us per step")


def test_a_layout_without_expert_parallelism_has_no_exchange_to_choose_on_cuda():
    """Catches one-rank expert groups counted as exchanges: with EP 1 nothing crosses a wire, so auto stays
    dynamic on CUDA too (a costed EP-1 op would save the 30 us NCCL estimate and pick static)."""
    op = _op(ExpertPlacement.even(4, 1), k=2, chunks=1)
    mode, reason = choose_exchange("auto", [op], (3,), 16, "cuda", False, 256)
    assert (mode, reason) == ("dynamic", "no token exchange between ranks")
