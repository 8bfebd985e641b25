"""The MoE tilings (``nonstop/runtime/megakernel/tiling/moe.py``) box by box at small odd shapes where every
chunking ends in a ragged piece: a short or missing last box is a race the sequential tests never show.
Expected boxes are derived by hand from the kernels' pointer arithmetic (``nonstop/kernels/moe.py``)."""

from __future__ import annotations

import torch

from nonstop.program.ir import SuperOp
from nonstop.runtime.megakernel.tiling import moe
from tests.megakernel.test_tiling_boxes import R_, W_, boxes, context


def _slices(tile) -> set[tuple]:
    return {(w.role, w.dim, w.start, w.stop, w.dynamic) for w in tile.weights}


def test_moe_front_router_latent_and_shared_tiles_end_ragged():
    """R = 2, D = 4, E = 5 router rows in BLOCK_NR = 2 (0:2, 2:4, 4:5), latent W = 3 and shared S = 3 in
    BLOCK_N = 2 (0:2, 2:3): the last router tile writes logit column 4, the last latent tile moe_in and
    moe_out column 2, the last shared tile act column 2 from gate row 2 and up row S + 2 = 5."""
    ctx = context(1, 2, {"x": 4, "moe_logits": 5, "moe_in": 3, "moe_out": 3, "moe_shared_act": 3})
    weights = {
        "router": torch.zeros(5, 4),
        "latent_down": torch.zeros(3, 4),
        "shared_gate_up": torch.zeros(6, 4),
        "norm": torch.zeros(4),
    }
    op = SuperOp("L0.moe_front", "moe_front", 0, ("x",), ("moe_logits", "moe_in"), weights, {})
    (main,) = moe.moe_front(ctx, op, dict(E=5, BLOCK_NR=2, W=3, BLOCK_N=2, HAS_SHARED=True, S=3))
    x = ("x", 0, 2, 0, 4, R_)
    norm = ("norm", -1, 0, 4, False)
    assert len(main.tiles) == 3 + 2 + 2
    assert boxes(ctx, main.tiles[2]) == {x, ("moe_logits", 0, 2, 4, 5, W_)}
    assert _slices(main.tiles[2]) == {("router", 0, 4, 5, False), norm}
    assert boxes(ctx, main.tiles[4]) == {x, ("moe_in", 0, 2, 2, 3, W_), ("moe_out", 0, 2, 2, 3, W_)}
    assert _slices(main.tiles[4]) == {("latent_down", 0, 2, 3, False), norm}
    assert boxes(ctx, main.tiles[6]) == {x, ("moe_shared_act", 0, 2, 2, 3, W_)}
    assert _slices(main.tiles[6]) == {("shared_gate_up", 0, 2, 3, False), ("shared_gate_up", 0, 5, 6, False), norm}


def test_moe_experts_ragged_chunks_with_three_rows():
    """R = 3 rows, I = 5 in BLOCK_I = 2 (chunks 0:2, 2:4, 4:5), 2 slots, P = 4 programs over the 6 items
    (item = slot·3 + chunk): program 1 takes items 1 and 5 = (slot 0, chunk 1) and (slot 1, chunk 2), i.e.
    act[(s·3 + r)·5 + cols] for every row; program 0 also writes the route table [2, 1 + R]; down tiles of
    BLOCK_NO = 4 over K = 7 (0:4, 4:7) read all of act [0, 2·3·5)."""
    ctx = context(1, 3, {"moe_logits": 4, "moe_in": 7, "moe_out": 7})
    op = SuperOp("L0.moe_experts", "moe_experts", 0, ("moe_logits", "moe_in"), ("moe_out",), {}, {})
    args = dict(I=5, slots=2, n_gate_up=4, n_chunks=3, BLOCK_I=2, K=7, BLOCK_NO=4)
    gate_up, down = moe.moe_experts(ctx, op, args)
    act = "moe_experts.act"
    reads = {("moe_logits", 0, 3, 0, 4, R_), ("moe_in", 0, 3, 0, 7, R_)}
    assert len(gate_up.tiles) == 4
    slot0_chunk1 = {(act, 0, 1, r * 5 + 2, r * 5 + 4, W_) for r in range(3)}
    slot1_chunk2 = {(act, 0, 1, (3 + r) * 5 + 4, (3 + r) * 5 + 5, W_) for r in range(3)}
    assert boxes(ctx, gate_up.tiles[1]) == reads | slot0_chunk1 | slot1_chunk2
    assert boxes(ctx, gate_up.tiles[0]) == reads | {("moe_experts.route", 0, 2, 0, 4, W_)} | {
        (act, 0, 1, r * 5, r * 5 + 2, W_) for r in range(3)
    } | {(act, 0, 1, (3 + r) * 5 + 2, (3 + r) * 5 + 4, W_) for r in range(3)}
    assert [boxes(ctx, t) for t in down.tiles] == [
        {(act, 0, 1, 0, 30, R_), ("moe_experts.route", 0, 2, 0, 4, R_), ("moe_out", 0, 3, a, b, W_)}
        for a, b in ((0, 4), (4, 7))
    ]


def test_moe_tail_last_tile_is_ragged():
    """D = 5 output columns in BLOCK_N = 2 (0:2, 2:4, 4:5), accumulating: the last tile reads and writes
    column 4 of the target and reads all of moe_out and the shared activations."""
    ctx = context(1, 2, {"moe_out": 3, "moe_shared_act": 3, "h": 5})
    weights = {"latent_up": torch.zeros(5, 3), "latent_norm": torch.zeros(3), "shared_down": torch.zeros(5, 3)}
    op = SuperOp("L0.moe_tail", "moe_tail", 0, ("moe_out", "moe_shared_act"), ("h",), weights, {"accumulate": True})
    (main,) = moe.moe_tail(ctx, op, dict(D=5, BLOCK_N=2))
    assert len(main.tiles) == 3
    assert boxes(ctx, main.tiles[2]) == {
        ("moe_out", 0, 2, 0, 3, R_),
        ("moe_shared_act", 0, 2, 0, 3, R_),
        ("h", 0, 2, 4, 5, W_),
        ("h", 0, 2, 4, 5, R_),
    }
    assert _slices(main.tiles[2]) == {
        ("latent_up", 0, 4, 5, False),
        ("latent_norm", -1, 0, 3, False),
        ("shared_down", 0, 4, 5, False),
    }


def test_moe_experts_first_mxfp4_slices_round_up_to_whole_bytes_and_scale_groups():
    """MXFP4 experts, I = 5 intermediate rows, K = 7: the first gate/up item (BLOCK_I = 2 rows) streams rows
    0..2 of w1/w3 (packed [E, 5, 4] bytes and [E, 5, 1] scales) and, of w2 ([E, 7, 3] bytes, [E, 7, 1]
    scales: columns in the tensor's own units), bytes 0..ceil(2·3/5) = 2 and scale group 0..ceil(2·1/5) = 1.
    Rounding down would declare 1 byte and an empty scale slice for elements 0..1."""
    ctx = context(1, 3, {"moe_logits": 3, "moe_in": 7, "moe_out": 7})
    u8 = torch.uint8
    weights = {"bias": torch.zeros(3)}
    for w in ("w1", "w3"):
        weights[f"{w}_packed"] = torch.zeros(3, 5, 4, dtype=u8)
        weights[f"{w}_scale"] = torch.zeros(3, 5, 1, dtype=u8)
    weights["w2_packed"] = torch.zeros(3, 7, 3, dtype=u8)
    weights["w2_scale"] = torch.zeros(3, 7, 1, dtype=u8)
    op = SuperOp("L0.moe_experts", "moe_experts", 0, ("moe_logits", "moe_in"), ("moe_out",), weights, {})
    args = dict(I=5, slots=2, n_gate_up=4, n_chunks=3, BLOCK_I=2, K=7, BLOCK_NO=4)
    gate_up, _ = moe.moe_experts(ctx, op, args)
    assert _slices(gate_up.tiles[0]) == {
        ("bias", -1, 0, 3, False),
        *((f"{w}_{part}", 1, 0, 2, True) for w in ("w1", "w3") for part in ("packed", "scale")),
        ("w2_packed", 2, 0, 2, True),
        ("w2_scale", 2, 0, 1, True),
    }
