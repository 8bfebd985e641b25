"""The regions the megakernel's tilings declare, checked box by box against ranges derived by hand from each
kernel's pointer arithmetic at small odd shapes (no model, no kernel): the waits and the validator's proof
are only as good as these boxes, and a missing or short box is a race that sequential execution never shows
(the tiny families run one KV split, so shapes the end-to-end tests never reach are pinned here)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from nonstop.program.ir import BufferSpec, SuperOp
from nonstop.runtime.megakernel.tasks import Access
from nonstop.runtime.megakernel.tiling import attention, dense, moe, sampling
from nonstop.runtime.megakernel.tiling.context import TileContext

R_, W_, P_ = Access.READ, Access.WRITE, Access.READ_PAST


def context(B: int, T: int, widths: dict[str, int], hidden: int = 8) -> TileContext:
    program = SimpleNamespace(
        buffers={n: BufferSpec(n, (w,) if w > 1 else (), "float32") for n, w in widths.items()},
        cfg=SimpleNamespace(hidden_size=hidden),
    )
    return TileContext(program, B, T)


def boxes(ctx: TileContext, tile) -> set[tuple]:
    return {(ctx.buffers[r.buffer].name, r.r0, r.r1, r.c0, r.c1, r.access) for r in tile.regions}


def test_gqa_attn_with_two_kv_splits():
    """H = 6 query heads in HKV = 2 groups of G = 3, D = 4, one sequence of T = 2 tokens, NS = 2 splits,
    BLOCK_M = 4 items (m = t·G + head in group) -> MB = 2. Partial cell (s, h) of a row at (s·H + h)·(D + 2).
    Group 1, block 1 holds items 4, 5 = token 1, heads 4 and 5."""
    ctx = context(1, 2, {"gqa_q": 24, "attn_out": 24})
    op = SuperOp(
        "L0.gqa_attn",
        "gqa_attn",
        0,
        ("gqa_q",),
        ("attn_out",),
        {},
        dict(heads=6, kv_heads=2, head_dim=4, cache_layer=0),
    )
    split, combine = attention.gqa_attn(ctx, op, {"NS": 2, "MB": 2, "BLOCK_M": 4})
    assert [t.tile for t in split.tiles] == list(range(8)) and [t.tile for t in combine.tiles] == list(range(4))
    kv = {(f"L0.{c}", 0, 2, 4, 8, a) for c in "kv" for a in (R_, P_)}
    # tile ((b·HKV + g)·MB + mb)·NS + s = ((0·2 + 1)·2 + 1)·2 + s = 6 + s
    assert boxes(ctx, split.tiles[6]) == kv | {
        ("gqa_q", 1, 2, 16, 24, R_),
        ("gqa_attn.partial", 1, 2, 24, 36, W_),
        ("attn_out", 1, 2, 16, 24, W_),  # split 0 writes a sequence whose keys fit one split
    }
    assert boxes(ctx, split.tiles[7]) == kv | {("gqa_q", 1, 2, 16, 24, R_), ("gqa_attn.partial", 1, 2, 60, 72, W_)}
    # the combine of that block reads the cells of BOTH splits: (0·6 + 4)·6 .. (0·6 + 6)·6 and (6 + 4)·6 ..
    assert boxes(ctx, combine.tiles[3]) == {
        ("gqa_attn.partial", 1, 2, 24, 36, R_),
        ("gqa_attn.partial", 1, 2, 60, 72, R_),
        ("attn_out", 1, 2, 16, 24, W_),
    }
    # block 0 of group 0: items 0..3 = token 0 heads 0..2, token 1 head 0
    assert boxes(ctx, combine.tiles[0]) == {
        ("gqa_attn.partial", 0, 1, 0, 18, R_),
        ("gqa_attn.partial", 0, 1, 36, 54, R_),
        ("attn_out", 0, 1, 0, 12, W_),
        ("gqa_attn.partial", 1, 2, 0, 6, R_),
        ("gqa_attn.partial", 1, 2, 36, 42, R_),
        ("attn_out", 1, 2, 0, 4, W_),
    }


def test_mla_attn_with_two_kv_splits():
    """N = 3 heads, kv_lora L = 2, rope 2, v_dim 2, T = 2, NS = 2, BLOCK_M = 4 -> MB = 2; cell = L + 2 = 4.
    Split tile (b·NS + s)·MB + mb; combine tile h merges head h's cells of every split."""
    ctx = context(1, 2, {"q_lat": 6, "q_pe": 6, "mla_gate": 6, "mla_out": 6})
    attrs = dict(heads=3, rope=2, kv_lora=2, v_dim=2, cache_layer=0, gated=True)
    op = SuperOp("L0.mla_attn", "mla_attn", 0, ("q_lat", "q_pe", "mla_gate"), ("mla_out",), {}, attrs)
    split, combine = attention.mla_attn(ctx, op, {"NS": 2, "MB": 2, "BLOCK_M": 4})
    # s = 1, mb = 1: items 4, 5 = token 1, heads 1 and 2
    assert boxes(ctx, split.tiles[3]) == {
        ("L0.latent", 0, 2, 0, 4, R_),
        ("L0.latent", 0, 2, 0, 4, P_),
        ("q_lat", 1, 2, 2, 6, R_),
        ("q_pe", 1, 2, 2, 6, R_),
        ("mla_attn.partial", 1, 2, 16, 24, W_),
    }
    assert boxes(ctx, combine.tiles[2]) == {
        ("mla_attn.partial", 0, 2, 8, 12, R_),
        ("mla_attn.partial", 0, 2, 20, 24, R_),
        ("mla_out", 0, 2, 4, 6, W_),
        ("mla_gate", 0, 2, 4, 6, R_),
    }


def test_kda_in_proj_moves_the_conv_windows_of_its_channels():
    """C = 3 channels, conv 3 (windows of K - 1 = 2 per channel, channel n = part·C + c at n·2), packed
    [q 3 | k 3 | v 3 | g 2 | beta 1 | f_a 2], BLOCK_N = 4: tile 1 = packed rows 4..7 = k 1..2, v 0..1;
    tile 2 = rows 8..11 = v 2, g 0..1, beta 0."""
    widths = {"x": 8, "kq": 3, "kk": 3, "kv": 3, "kg": 2, "kb": 1, "kf": 2}
    ctx = context(2, 1, widths)
    attrs = dict(channels=3, conv_size=3, cache_layer=0, in_sizes=[3, 3, 3, 2, 1, 2])
    op = SuperOp("L0.kda_in_proj", "kda_in_proj", 0, ("x",), ("kq", "kk", "kv", "kg", "kb", "kf"), {}, attrs)
    (main,) = attention.kda_in_proj(ctx, op, {"BLOCK_N": 4})
    assert len(main.tiles) == 4
    assert boxes(ctx, main.tiles[1]) == {
        ("x", 0, 2, 0, 8, R_),
        ("kk", 0, 2, 1, 3, W_),
        ("kv", 0, 2, 0, 2, W_),
        ("L0.conv", 0, 2, 8, 12, R_),
        ("L0.conv", 0, 2, 8, 12, W_),
        ("L0.conv", 0, 2, 12, 16, R_),
        ("L0.conv", 0, 2, 12, 16, W_),
    }
    assert boxes(ctx, main.tiles[2]) == {
        ("x", 0, 2, 0, 8, R_),
        ("kv", 0, 2, 2, 3, W_),
        ("kg", 0, 2, 0, 2, W_),
        ("kb", 0, 2, 0, 1, W_),
        ("L0.conv", 0, 2, 16, 18, R_),
        ("L0.conv", 0, 2, 16, 18, W_),
    }


def test_kda_core_reads_its_head_and_moves_its_state():
    """H = 2 heads of D = 2, B = 2 sequences of one token: tile b·H + h; the state row b holds H·D·D."""
    widths = {"kq": 4, "kk": 4, "kv": 4, "kg": 4, "kb": 2, "kf": 3, "ko": 4}
    ctx = context(2, 1, widths)
    op = SuperOp(
        "L0.kda_core",
        "kda_core",
        0,
        ("kq", "kk", "kv", "kg", "kb", "kf"),
        ("ko",),
        {},
        dict(heads=2, head_dim=2, cache_layer=0),
    )
    (main,) = attention.kda_core(ctx, op, {})
    assert boxes(ctx, main.tiles[3]) == {
        ("kq", 1, 2, 2, 4, R_),
        ("kk", 1, 2, 2, 4, R_),
        ("kv", 1, 2, 2, 4, R_),
        ("kg", 1, 2, 2, 4, R_),
        ("kb", 1, 2, 1, 2, R_),
        ("kf", 1, 2, 0, 3, R_),
        ("L0.recurrent", 1, 2, 4, 8, R_),
        ("L0.recurrent", 1, 2, 4, 8, W_),
        ("ko", 1, 2, 2, 4, W_),
    }


def test_moe_experts_programs_take_every_pth_item():
    """R = 2 rows, I = 6, 3 slots, 2 chunks of BLOCK_I = 4, P = 2 gate_up programs: program p takes items
    p, p + 2, p + 4 (item = slot·2 + chunk), i.e. chunk p of every slot; act row r of slot s at (s·R + r)·I.
    Program 0 also writes the route table [3, 1 + R]. down: BLOCK_NO = 2 columns of moe_out (K = 5)."""
    ctx = context(1, 2, {"moe_logits": 4, "moe_in": 3, "moe_out": 5})
    op = SuperOp("L0.moe_experts", "moe_experts", 0, ("moe_logits", "moe_in"), ("moe_out",), {}, {})
    args = dict(I=6, slots=3, n_gate_up=2, n_chunks=2, BLOCK_I=4, K=5, BLOCK_NO=2)
    gate_up, down = moe.moe_experts(ctx, op, args)
    reads = {("moe_logits", 0, 2, 0, 4, R_), ("moe_in", 0, 2, 0, 3, R_)}
    act = "moe_experts.act"
    assert boxes(ctx, gate_up.tiles[0]) == reads | {
        ("moe_experts.route", 0, 3, 0, 3, W_),
        *((act, 0, 1, a, a + 4, W_) for a in (0, 6, 12, 18, 24, 30)),
    }
    assert boxes(ctx, gate_up.tiles[1]) == reads | {(act, 0, 1, a, a + 2, W_) for a in (4, 10, 16, 22, 28, 34)}
    assert [boxes(ctx, t) for t in down.tiles] == [
        {(act, 0, 1, 0, 36, R_), ("moe_experts.route", 0, 3, 0, 3, R_), ("moe_out", 0, 2, a, b, W_)}
        for a, b in ((0, 2), (2, 4), (4, 5))
    ]


def test_sample_and_advance_boxes():
    """V = 10 logits in chunks of 4 (NC = 3, the last one 2 wide), cells of 4 + KC + SC = 7 and 4·SC = 4;
    advance of B = 2 sequences x T = 3: rows 3..5 of sequence 1, its start and its token-log row."""
    params = ("sample_temperature", "sample_top_k", "sample_top_p", "sample_seed", "sample_offset")
    widths = {"logits": 10, "next_ids": 1, "ids": 1, "token_log": 64, **{p: 1 for p in params}}
    ctx = context(2, 1, widths)
    op = SuperOp("sample", "sample", None, ("logits", *params), ("next_ids",), {}, {})
    scan, verify, pick = sampling.sample(ctx, op, {"NC": 3, "CHUNK": 4, "KC": 2, "SC": 1})
    mine = {(p, 1, 2, 0, 1, R_) for p in params}
    assert boxes(ctx, scan.tiles[5]) == mine | {("logits", 1, 2, 8, 10, R_), ("sample.partial", 1, 2, 14, 21, W_)}
    assert boxes(ctx, verify.tiles[4]) == mine | {
        ("logits", 1, 2, 4, 8, R_),
        ("logits", 1, 2, 0, 10, R_),
        ("sample.partial", 1, 2, 0, 21, R_),
        ("sample.verify", 1, 2, 4, 8, W_),
    }
    assert boxes(ctx, pick.tiles[1]) == mine | {
        ("logits", 1, 2, 0, 10, R_),
        ("sample.partial", 1, 2, 0, 21, R_),
        ("sample.verify", 1, 2, 0, 12, R_),
        ("next_ids", 1, 2, 0, 1, W_),
        ("sample.path", 1, 2, 0, 1, W_),
    }
    ctx = context(2, 3, widths)
    (main,) = sampling.advance(ctx, None, {})
    assert boxes(ctx, main.tiles[1]) == {
        ("next_ids", 3, 6, 0, 1, R_),
        ("ids", 3, 6, 0, 1, W_),
        ("start", 1, 2, 0, 1, R_),
        ("start", 1, 2, 0, 1, W_),
        ("token_log", 1, 2, 0, 64, W_),
        ("sample_offset", 3, 6, 0, 1, R_),
        ("sample_offset", 3, 6, 0, 1, W_),
    }


def test_gqa_qkv_rope_pairs_in_both_layouts():
    """One head of D = 6 (3 pairs), BLOCK_P = 2 -> PB = 2 tiles per packed head (q, k, v): tile 2j + 1 holds
    pair 2, channels 4, 5 (GPT-J) or 2 and 5 (NeoX)."""
    for interleaved, spans in ((True, [(4, 6)]), (False, [(2, 3), (5, 6)])):
        ctx = context(1, 1, {"x": 8, "gqa_q": 6})
        attrs = dict(heads=1, kv_heads=1, head_dim=6, cache_layer=0, interleaved=interleaved)
        op = SuperOp("L0.gqa_qkv_rope", "gqa_qkv_rope", 0, ("x",), ("gqa_q",), {}, attrs)
        (main,) = attention.gqa_qkv_rope(ctx, op, {"BLOCK_P": 2})
        assert [t.tile for t in main.tiles] == list(range(6))
        for j, out in enumerate(("gqa_q", "L0.k", "L0.v")):
            want = {("x", 0, 1, 0, 8, R_)} | {(out, 0, 1, a, b, W_) for a, b in spans}
            assert boxes(ctx, main.tiles[2 * j + 1]) == want, (interleaved, out)


def test_embed_tile_reads_its_own_token():
    """Tile r of the embedding reads ids[r] and writes row r (B = 1 x T = 3)."""
    ctx = context(1, 3, {"ids": 1, "h": 8})
    weights = {"embed": torch.zeros(5, 8)}
    op = SuperOp("embed", "embed", None, ("ids",), ("h",), weights, {})
    (main,) = dense.embed(ctx, op, {})
    assert [boxes(ctx, t) for t in main.tiles] == [
        {("ids", r, r + 1, 0, 1, R_), ("h", r, r + 1, 0, 8, W_)} for r in range(3)
    ]


def test_a_workspace_grows_to_its_largest_use():
    """Ops of one kind share a workspace: a later, wider use grows the buffer every box is checked in."""
    ctx = context(2, 1, {})
    a = ctx.scratch("w", 2, 3)
    assert ctx.scratch("w", 2, 5) == a and (ctx.buffers[a].rows, ctx.buffers[a].cols) == (2, 5)
    assert ctx.scratch("w", 2, 4) == a and ctx.buffers[a].cols == 5
