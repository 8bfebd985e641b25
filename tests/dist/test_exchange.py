"""The static MoE exchange's pieces and the choice of mode, without a process group: capacities that hold
every routing (and are reached), buffer rows that never collide, senders and receivers that agree on
every split size, the row format, the wire bytes the cost model reports, and ``choose_exchange``."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.dist import ExpertPlacement, Layout
from nonstop.dist.exchange import buffer_rows, choose_exchange, filled_first, pack, static_plan, unpack
from nonstop.dist.layout import split_range
from nonstop.dist.program import engine_exchange, rank_step, shapes_program
from nonstop.program.cost import static_splits

NANO = ModelConfig.from_file("nonstop/assets/k3-nano")


def _op(placement: ExpertPlacement, layout: Layout, rank: int, k: int, chunks: int) -> SimpleNamespace:
    """A stand-in ``moe_ep`` op of ``rank`` with the attributes the exchange reads."""
    attrs = {
        "placement": placement,
        "ep_ranks": layout.ep,
        "ep_rank": layout.ep_rank(rank),
        "tp_ranks": layout.tp,
        "tp_rank": layout.tp_rank(rank),
        "rank": rank,
        "world": layout.world,
        "top_k": k,
        "chunks": chunks,
        "max_local": placement.max_local,
    }
    return SimpleNamespace(kind="moe_ep", attrs=attrs)


def _random_placement(rng: random.Random, experts: int, ranks: int) -> ExpertPlacement:
    """Every expert on one to three distinct ranks (redundant replicas); some ranks may hold nothing."""
    held = [set() for _ in range(ranks)]
    crowded = rng.randrange(ranks)  # one rank takes most experts: uneven counts, often empty ranks
    for e in range(experts):
        first = crowded if rng.random() < 0.6 else rng.randrange(ranks)
        held[first].add(e)
        for _ in range(rng.randrange(3)):
            held[rng.randrange(ranks)].add(e)
    return ExpertPlacement(experts, tuple(tuple(sorted(h)) for h in held))


def _routing(rng: random.Random, rows: int, k: int, placement: ExpertPlacement) -> torch.Tensor:
    """ids [rows, k] of distinct experts per row: uniform, or concentrated on one rank's experts first."""
    ids = []
    target = rng.choice([s for s in placement.slots if s])
    for _ in range(rows):
        order = list(range(placement.num_experts))
        rng.shuffle(order)
        if rng.random() < 0.7:
            order.sort(key=lambda e: e not in target)
        ids.append(order[:k])
    return torch.tensor(ids, dtype=torch.long).reshape(rows, k)


def test_static_buffers_hold_every_routing_and_ranks_agree_on_the_splits():
    rng = random.Random(11)
    for _ in range(300):
        tp, ep = rng.choice([(1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (2, 4), (3, 2)])
        layout = Layout.make(tp, ep, world=max(tp, ep) if max(tp, ep) % min(tp, ep) == 0 else tp * ep)
        experts = rng.randrange(2, 9)
        k, chunks = rng.randrange(1, min(4, experts) + 1), rng.randrange(1, 4)
        placement = _random_placement(rng, experts, ep)
        group_rows = tuple(rng.randrange(0, 17) for _ in range(layout.dp))
        ops = [_op(placement, layout, r, k, chunks) for r in range(layout.world)]
        for r, op in enumerate(ops):
            send, recv = static_splits(op, group_rows)
            for peer in layout.ep_group(r):  # what r sends a peer is what that peer expects from r
                assert send[layout.ep_rank(peer)] == static_splits(ops[peer], group_rows)[1][layout.ep_rank(r)]
            start, stop = split_range(group_rows[layout.dp_index(r)], tp, layout.tp_rank(r))
            ids = _routing(rng, stop - start, k, placement)
            dest, slot = placement.route(ids.reshape(-1), layout.ep_rank(r))
            P = dest.shape[0]
            chunk = torch.arange(P) * chunks // max(P, 1)
            plan = static_plan(op, group_rows, "cpu")
            order, rows = buffer_rows(dest, slot, chunk, ep, max(1, placement.max_local), chunks, plan)
            assert len(set(rows.tolist())) == P  # no two pairs share a buffer row
            for i, pair in enumerate(order.tolist()):
                c, d = int(chunk[pair]), int(dest[pair])
                first = c * plan.send_rows + int(plan.offsets[d])
                assert first <= int(rows[i]) < first + send[d], "a pair fell outside its destination's capacity"
            assert plan.recv == recv


def test_capacity_is_reached_when_a_rank_gets_all_it_can():
    placement = ExpertPlacement(6, ((0, 1, 2, 3), (4,), (5,)))
    layout = Layout.make(1, 3)
    op = _op(placement, layout, 1, 3, 1)
    send, _ = static_splits(op, (5, 5, 5))
    ids = torch.tensor([[0, 1, 2]] * 5)  # every row's three experts live on rank 0
    dest, slot = placement.route(ids.reshape(-1), 1)
    assert send == [15, 5, 5] and int((dest == 0).sum()) == send[0]  # 5 rows x 3 experts: exactly the capacity


def test_rows_round_trip_through_the_byte_format():
    gen = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        z = torch.randn(5, 7, generator=gen).to(dtype)  # odd width: the 4-byte header leaves rows unaligned
        slots = torch.tensor([2, 0, 5, 1, 0])
        rows = torch.tensor([7, 0, 3, 8, 1])
        got_slots, got_z = unpack(pack(z, slots, rows, 9), dtype)
        assert got_slots.tolist() == [0, 0, -1, 5, -1, -1, -1, 2, 1]
        assert torch.equal(got_z[rows], z) and not got_z[[2, 4, 5, 6]].any()
        first = filled_first(got_slots)
        assert got_slots[first].tolist() == [0, 0, 5, 2, 1, -1, -1, -1, -1]  # filled rows first, in arrival order


def test_static_wire_bytes_are_the_whole_buffers():
    # k3-nano under EP 8 holds one expert per rank: a rank routing 3 rows (top-2) may send each peer 3 pairs
    layout = Layout.make(1, 8)
    latent, k = NANO.moe.latent_size, NANO.moe.top_k
    moe_layers = NANO.mlp_types.count("moe")
    static = rank_step(NANO, layout, rows=3, exchange="static")
    dynamic = rank_step(NANO, layout, rows=3, exchange="dynamic")
    by = {c.purpose: c for c in static.collectives}
    assert by["dispatch (expert inputs)"].wire_bytes == moe_layers * 7 * 3 * (latent * 2 + 4)
    assert by["combine (expert outputs)"].wire_bytes == moe_layers * 7 * 3 * latent * 2
    assert "split sizes" not in by and static.token_all_to_alls == dynamic.token_all_to_alls == 2 * moe_layers
    by_dyn = {c.purpose: c for c in dynamic.collectives}
    assert by_dyn["dispatch (expert inputs)"].wire_bytes == pytest.approx(moe_layers * 3 * k * 7 / 8 * latent * 2)
    # two chunks: a chunk holds at most 3 of a rank's 6 pairs, and one expert per peer allows 3 there
    two = {c.purpose: c for c in rank_step(NANO, layout, rows=3, chunks=2, exchange="static").collectives}
    assert two["dispatch (expert inputs)"].wire_bytes == 2 * by["dispatch (expert inputs)"].wire_bytes
    assert two["dispatch (expert inputs)"].count == 2 * moe_layers


def test_static_wire_bytes_of_the_average_rank():
    # TP 2 x EP 2, 3 rows: rank 0 routes 2 rows, rank 1 one; each holds 4 experts (top-2), so each sends the
    # other 2 rows' worth of pairs per routed row: rank 0 sends 4 rows and gets 2 back to return, rank 1 the reverse
    from nonstop.dist.program import collectives_as

    step = rank_step(NANO, Layout.make(2, 2), rows=3, exchange="static")
    row = NANO.moe.latent_size * 2
    per_rank = [
        sum(c.wire_bytes for c in collectives_as(step.program, 3, t) if c.kind == "all_to_all") for t in range(2)
    ]
    moe_layers = NANO.mlp_types.count("moe")
    assert per_rank == [moe_layers * (4 * (row + 4) + 2 * row), moe_layers * (2 * (row + 4) + 4 * row)]


def test_the_choice_of_mode():
    layout = Layout.make(2, 4)
    ops = shapes_program(NANO, layout, 0, torch.float32).ops
    width = NANO.moe.latent_size * 4
    for requested in ("static", "dynamic"):
        assert choose_exchange(requested, ops, (3, 1), 16, "cpu", False, width)[0] == requested
    assert choose_exchange("auto", ops, (3, 1), 16, "cpu", True, width)[0] == "static"  # captured: required
    assert choose_exchange("auto", ops, (40, 1), 16, "cuda", True, width)[0] == "dynamic"  # a prefill
    assert choose_exchange("auto", ops, (3, 1), 16, "cpu", False, width)[0] == "static"  # a few padding rows
    assert choose_exchange("auto", ops, (16, 16), 16, "cpu", False, 10**9)[0] == "dynamic"  # gigabyte rows
    # every rank of the expert group decides alike: nothing rank-specific goes in
    for rows in [(3, 1), (0, 2), (16, 5)]:
        rank_ops = [shapes_program(NANO, layout, r, torch.float32).ops for r in range(4)]
        assert len({choose_exchange("auto", o, rows, 16, "cpu", False, width) for o in rank_ops}) == 1


def test_program_command_prints_the_mode_the_engine_picks_and_the_other(capsys):
    from nonstop.cli import main

    cfg = ModelConfig.preset("kimi-k3")
    moe_layers = cfg.mlp_types[:6].count("moe")
    seen = {}
    for flag in ([], ["--exchange", "static"], ["--exchange", "dynamic"]):
        args = ["program", "-m", "kimi-k3", "--num-layers", "6", "--tp", "8", "--ep", "64", "--summary", *flag]
        assert main(args) == 0
        out = capsys.readouterr().out
        assert f"all-to-alls per step: {2 * moe_layers} token exchanges" in out
        wire = next(line for line in out.splitlines() if line.startswith("bytes on the wire per token per rank"))
        seen[flag[-1] if flag else "default"] = (out, wire)
    mode, _ = engine_exchange(cfg.with_num_layers(6), Layout.make(8, 64), 1, 2, torch.bfloat16, "cuda")
    assert f"{mode} on cuda (the engine picks it" in seen["default"][0]
    assert seen["default"][1] == seen[mode][1]
    assert f"{moe_layers} split-size exchanges" in seen["dynamic"][0] and "0 split-size exchanges" in seen["static"][0]
