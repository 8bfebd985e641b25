"""Gaps a second mutation audit of ``dist/program.py`` found: what ``distribute`` gives the attention group's
first rank and the others (checked on the shapes-only Program of a tiny Llama with biases, tp 2, no
process group). Per the module docstring: every op adding a partial sum to the residual stream adds it on
the group's first rank, with the biases, and writes it alone (no residual, no bias) on the others, a tp
all-reduce after each; rank t's embedding part starts at t * ceil(V / T)."""

from __future__ import annotations

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.dist import Layout
from nonstop.dist.program import shapes_program
from tests.tiny_configs import LLAMA

RESIDUAL = ("linear_residual", "mlp", "moe_tail")


def _program(rank: int, tp: int = 2):
    cfg = ModelConfig.from_hf_dict({**LLAMA, "num_attention_heads": 6, "num_key_value_heads": 6, "mlp_bias": True})
    return shapes_program(cfg, Layout.make(tp=tp), rank, torch.float32)


@pytest.mark.parametrize("rank, leader", [(0, True), (1, False)])
def test_only_the_groups_first_rank_adds_the_residual_and_the_biases(rank, leader):
    """Catches the roles swapped (rank 1 adding the residual and biases, rank 0 not) and a non-leader
    left accumulating into the stream (the all-reduce then sums the residual T times)."""
    ops = [op for op in _program(rank).ops if op.kind in RESIDUAL]
    assert len(ops) == 6  # o_proj and the dense MLP of each of the 3 layers
    for op in ops:
        assert op.attrs.get("accumulate", True) is leader, (rank, op.name, op.attrs.get("accumulate"))
        biases = {n for n in ("b", "down_b") if n in op.weights}
        assert biases == ({"b"} if op.kind == "linear_residual" else {"down_b"}) if leader else not biases
    names = [op.name for op in _program(rank).ops]
    for op in ops:  # each partial sum is summed over the group right after it
        assert names[names.index(op.name) + 1] == f"{op.name}.all_reduce"


@pytest.mark.parametrize("tp", [2, 3])
def test_each_ranks_embedding_part_starts_at_its_padded_vocabulary_rows(tp):
    """V = 131: ceil(131 / 2) = 66 rows per rank (rank 1 starts at 66, not 131 // 2 = 65), ceil(131 / 3) = 44
    (starts 0, 44, 88). Catches the start taken from the unpadded V // T: every id of the rank's part then
    reads the row before it."""
    rows = -(-131 // tp)
    for t in range(tp):
        (embed,) = [op for op in _program(t, tp).ops if op.kind == "embed_shard"]
        assert embed.attrs["vocab_start"] == t * rows


def _deepseek(layout: Layout, rank: int):
    from tests.tiny_configs import DEEPSEEK

    return shapes_program(ModelConfig.from_hf_dict(DEEPSEEK), layout, rank, torch.float32)


@pytest.mark.parametrize("rank, width", [(0, 7), (1, 7), (2, 6)])
def test_the_shared_experts_activation_is_this_ranks_part(rank, width):
    """DeepSeek's shared expert (intermediate 20) over tp 3: rank t's activation buffer holds its 7, 7 or 6
    columns (half its fused gate/up rows). Catches the width taken as the whole fused rows (twice as wide)."""
    program = _deepseek(Layout.make(tp=3), rank)
    fronts = [op for op in program.ops if op.kind == "moe_front"]
    assert len(fronts) == 2 and all(op.attrs["shared_width"] == width for op in fronts)
    assert program.buffers["moe_shared_act"].row_shape == (width,)


@pytest.mark.parametrize("tp, ep, rank", [(3, 1, 1), (3, 1, 2), (1, 3, 2)])
def test_the_moe_ep_op_knows_this_ranks_place_in_both_groups(tp, ep, rank):
    """tp 3 x ep 1: rank 1 is tp rank 1 (it routes rows [lo, hi) of part 1) but ep rank 0; tp 1 x ep 3:
    rank 2 is ep rank 2, holding experts 6 and 7 of 8 (parts 3, 3, 2). Catches the tp rank taken from the
    expert group (every rank of the attention group routing the same rows), and the local expert count
    taken as the largest rank's (3: a slot of an expert the rank does not hold)."""
    ops = [op for op in _deepseek(Layout.make(tp=tp, ep=ep), rank).ops if op.kind == "moe_ep"]
    assert len(ops) == 2
    for op in ops:
        a = op.attrs
        assert (a["tp_rank"], a["tp_ranks"], a["ep_rank"], a["ep_ranks"]) == (rank % tp, tp, rank % ep, ep)
        held = [3, 3, 2][rank] if ep == 3 else 8
        assert (a["local_experts"], a["max_local"]) == (held, 3 if ep == 3 else 8)


def test_an_expert_only_layout_still_exchanges_the_tokens():
    """tp 1 x ep 3 has no tensor parallelism but three ranks: its MoE layers must become ``moe_ep`` (each
    rank holds only some experts). Catches the Program left as the single device's when tp is 1 (each rank
    running experts it does not hold)."""
    kinds = [op.kind for op in _deepseek(Layout.make(ep=3), 0).ops]
    assert kinds.count("moe_ep") == 2 and "moe_experts" not in kinds


def _even_deepseek(layout: Layout, rank: int, exchange: str):
    from tests.tiny_configs import DEEPSEEK

    cfg = ModelConfig.from_hf_dict({**DEEPSEEK, "n_routed_experts": 6, "n_group": 3})
    return shapes_program(cfg, layout, rank, torch.float32, exchange=exchange)


@pytest.mark.parametrize("exchange", ["dynamic", "static"])
def test_collectives_as_another_tp_rank_are_that_ranks_own(exchange):
    """DeepSeek with 6 experts at tp 3 x ep 3 (2 experts per rank), 5 rows (routed 2, 2, 1 by the tp ranks):
    rank 0's Program replayed as tp rank t must give the collectives rank t's own Program gives (its rows,
    its place in the expert group: the static buffers it sends). Catches the replay keeping rank 0's global
    rank (every rank's static exchange costed as rank 0's)."""
    from nonstop.dist.program import collectives_as
    from nonstop.program.cost import op_collectives

    layout = Layout.make(tp=3, ep=3)
    first = _even_deepseek(layout, 0, exchange)
    for t in range(3):
        own = _even_deepseek(layout, t, exchange)
        want = [c for op in own.ops for c in op_collectives(op, own, 5)]
        assert collectives_as(first, 5, t) == want, t


def test_collectives_as_a_rank_holding_fewer_experts_are_its_own():
    """DeepSeek with 8 experts at tp 3 x ep 3 (experts 3, 3, 2): tp rank 2 holds 2 experts, so a larger share
    of its pairs crosses the wire than rank 0's. ``collectives_as(rank 0's Program, rows, 2)`` kept rank 0's
    ``local_fraction`` and ``local_experts`` (it replaced only tp_rank / rank / ep_rank), so
    ``RankStep.mean_wire_bytes`` averaged rank 0's figures three times (dispatch 270 B instead of 324 B)."""
    from nonstop.dist.program import collectives_as
    from nonstop.program.cost import op_collectives

    layout = Layout.make(tp=3, ep=3)
    first = _deepseek(layout, 0)
    own = _deepseek(layout, 2)
    assert collectives_as(first, 5, 2) == [c for op in own.ops for c in op_collectives(op, own, 5)]
