"""Gaps the mutation audit found in the single-process dist tests: ``choose_exchange`` at its edges
(hand arithmetic from the documented link model), replica routing when the source holds an expert
itself, the EPLB-style rebalancer's rules, placement / layout validation, the kv head a rank keeps
under replicated GQA heads, leader-only biases, and every rank part's shape against the rank's model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.dist import ExpertPlacement, Layout, LayoutError
from nonstop.dist.exchange import GLOO_CPU, NCCL_NODE, NCCL_NODES, choose_exchange, link_for
from nonstop.dist.program import shapes_program
from nonstop.dist.shard import kv_heads, leader_only, local_config, rank_shards
from nonstop.weights.layout import checkpoint_layout
from tests.tiny_configs import DEEPSEEK, KIMI_K3, LLAMA

NANO = ModelConfig.from_file("nonstop/assets/k3-nano")


# ----------------------------------------------------------------------------- choose_exchange


def _two_rank_op() -> SimpleNamespace:
    """A ``moe_ep`` stand-in: 2 experts on 2 ranks (one each), top-1, one chunk, no tensor parallelism."""
    placement = ExpertPlacement.even(2, 2)
    attrs = dict(placement=placement, ep_ranks=2, ep_rank=0, tp_ranks=1, tp_rank=0, rank=0, world=2)
    attrs.update(top_k=1, chunks=1, max_local=1)
    return SimpleNamespace(kind="moe_ep", attrs=attrs)


def _mode(width: int, device: str) -> str:
    return choose_exchange("auto", [_two_rank_op()], (1, 1), 16, device, False, width)[0]


def test_auto_mode_weighs_padding_per_rank_against_the_link_model():
    """Both groups route 1 row of w bytes. dynamic: half of each rank's pair leaves it (2 · 1/2 · 2w bytes in
    all); static: each rank sends its peer a 1-row buffer both ways, 2 · (2w + 4) bytes. Padding per rank =
    (2w + 8) / 2 / bandwidth = (w + 4) / bandwidth; saved per step = one split-size all-to-all of 4 bytes +
    the host read (the split sizes are costed there only, not again in the padding)."""
    gloo_saved = GLOO_CPU.per_peer_s + 4 / GLOO_CPU.bytes_per_s  # 300 us + 4 bytes
    w_edge = gloo_saved * GLOO_CPU.bytes_per_s - 4  # 255,000 bytes
    assert _mode(int(w_edge * 0.8), "cpu") == "static"
    assert _mode(int(w_edge * 1.2), "cpu") == "dynamic"
    nccl_saved = NCCL_NODE.collective_s + 4 / NCCL_NODE.bytes_per_s + NCCL_NODE.host_sync_s  # ~30 us
    w_edge = nccl_saved * NCCL_NODE.bytes_per_s - 4  # ~13,500 bytes
    assert _mode(int(w_edge * 0.8), "cuda") == "static"
    assert _mode(int(w_edge * 1.2), "cuda") == "dynamic"
    mode, reason = choose_exchange("auto", [_two_rank_op()], (1, 1), 16, "cpu", False, 200_000)
    padding = (200_000 + 4) / GLOO_CPU.bytes_per_s
    assert mode == "static" and f"static padding {padding * 1e6:.0f} us <" in reason


def test_a_captured_step_is_static_whatever_the_padding_and_prefill_starts_past_max_rows():
    ops = shapes_program(NANO, Layout.make(2, 4), 0, torch.float32).ops
    huge = 10**9  # gigabyte rows: auto would never pick static on cost
    assert choose_exchange("auto", ops, (16, 16), 16, "cpu", False, huge)[0] == "dynamic"
    assert choose_exchange("auto", ops, (16, 16), 16, "cpu", True, huge)[0] == "static"  # exactly max_rows
    assert choose_exchange("auto", ops, (17, 1), 16, "cpu", True, huge)[0] == "dynamic"  # more: a prefill


def test_link_for_a_node_of_eight_gpus():
    assert link_for("cpu", 4) is GLOO_CPU
    assert link_for("cuda", 2) is NCCL_NODE and link_for("cuda", 8) is NCCL_NODE
    assert link_for("cuda", 9) is NCCL_NODES


# ----------------------------------------------------------------------------- placement


def test_routing_with_replicas_stays_local_and_names_the_right_slot():
    # expert 0 on both ranks at different local indices; expert 3 only on rank 1
    p = ExpertPlacement(4, ((1, 2, 0), (0, 3)))
    ids = torch.tensor([0, 0, 1, 2, 3, 0, 3, 1])  # expert 0 at odd and even pair indices
    for source in (0, 1):
        dest, slot = p.route(ids, source)
        for e, d, i in zip(ids.tolist(), dest.tolist(), slot.tolist()):
            assert p.slots[d][i] == e
            if e in p.slots[source]:
                assert d == source  # a pair whose expert the source holds never crosses the wire


def test_placement_refuses_expert_ids_outside_the_model():
    with pytest.raises(ValueError, match="outside 0..1"):
        ExpertPlacement(2, ((0,), (1, 5)))


def test_rebalanced_places_heaviest_first_on_the_least_loaded_rank():
    # per rank 3 slots; 10 -> r0; 3, 3, 3 -> r1 (lighter each time; then full); 1, 1 -> r0
    bal = ExpertPlacement.rebalanced([10, 3, 3, 3, 1, 1], 2)
    assert bal.slots == ((0, 4, 5), (1, 2, 3))


def test_rebalanced_never_puts_two_replicas_of_an_expert_on_one_rank():
    for load, ranks, redundant in (([100, 1], 2, 2), ([100, 90, 1, 1], 2, 1), ([50, 40, 3, 2, 1, 1], 3, 3)):
        bal = ExpertPlacement.rebalanced(load, ranks, redundant)
        assert bal.physical == len(load) + redundant
        assert all(len(set(s)) == len(s) for s in bal.slots), bal.slots


def test_rebalanced_refuses_a_negative_redundancy():
    with pytest.raises(ValueError, match="redundant"):
        ExpertPlacement.rebalanced([1, 2, 3, 4], 2, redundant=-1)


# ----------------------------------------------------------------------------- layout


def test_layout_validation_edges():
    with pytest.raises(LayoutError, match="--world"):
        Layout.make(world=0)
    with pytest.raises(LayoutError, match="give --world 12"):  # lcm(4, 6), the smallest world both divide
        Layout.make(tp=4, ep=6)
    lay = Layout.make(2, 2)
    lay.check_rank(1)
    with pytest.raises(LayoutError, match="outside the world"):
        lay.check_rank(2)
    with pytest.raises(LayoutError, match="--ep is 4"):
        Layout.make(1, 4, placement=ExpertPlacement.even(8, 2)).placement_for(0, 8)


# ----------------------------------------------------------------------------- shards


def test_a_rank_keeps_the_kv_head_its_query_heads_read():
    """GQA: query head h reads kv head h // (H / kv). With 8 query heads, 2 kv heads and tp 4, rank t holds
    query heads 2t, 2t+1, so ranks 0, 1 read kv head 0 and ranks 2, 3 kv head 1."""
    cfg = ModelConfig.from_hf_dict({**LLAMA, "num_attention_heads": 8, "num_key_value_heads": 2})
    lay = Layout.make(tp=4)
    for t in range(4):
        q_heads = range(t * 2, t * 2 + 2)
        assert kv_heads(cfg, lay, t) == (q_heads[0] // 4, q_heads[0] // 4 + 1)


def test_reduced_output_biases_are_leader_only():
    assert leader_only("layers.0.self_attn.o_proj.bias") and leader_only("layers.3.mlp.down_proj.bias")
    assert leader_only("layers.1.mlp.shared_experts.down_proj.bias")
    assert not leader_only("layers.0.mlp.up_proj.bias") and not leader_only("layers.0.self_attn.q_proj.bias")


@pytest.mark.parametrize("raw,tp,ep", [(KIMI_K3, 3, 1), (DEEPSEEK, 3, 2), ("nano", 2, 4)])
def test_every_rank_part_has_the_shape_of_the_ranks_model(raw, tp, ep):
    """What a rank cuts from the checkpoint is what the model of its ``local_config`` holds: attention parts
    of its heads, dense MLP parts, vocabulary parts with their pad rows, its experts stacked (the shared
    experts' size is not in the config: the rank's model takes their parts as they come)."""
    cfg = NANO if raw == "nano" else ModelConfig.from_hf_dict(raw)
    if raw is KIMI_K3:  # KDA heads and MLA heads that 3 divides
        text = {**raw["text_config"], "num_attention_heads": 6}
        text["linear_attn_config"] = {**text["linear_attn_config"], "num_heads": 3}
        cfg = ModelConfig.from_hf_dict({**raw, "text_config": text})
    lay = Layout.make(tp, ep, world=math.lcm(tp, ep))
    for rank in range(lay.world):
        local = {s.param: s.shape for s in checkpoint_layout(local_config(cfg, lay, rank))}
        for shard in rank_shards(cfg, lay, rank):
            if ".shared_experts." in shard.spec.param:
                continue
            want = local[shard.spec.param]
            if shard.experts is not None:
                want = (len(shard.experts), *want[1:])
            assert shard.shape == want, f"rank {rank} {shard.spec.param}"


# ----------------------------------------------------------------------------- moe_ep on one rank


def _moe_op(chunks: int) -> SimpleNamespace:
    moe = NANO.moe
    E = moe.num_experts
    placement = ExpertPlacement.even(E, 1)
    attrs = dict(moe=moe, placement=placement, ep_ranks=1, ep_rank=0, tp_ranks=1, tp_rank=0, rank=0, world=1)
    attrs.update(chunks=chunks, overlap=False, top_k=moe.top_k, max_local=placement.max_local)
    return SimpleNamespace(attrs=attrs, weights={"bias": torch.zeros(E)}, writes=["moe_out"])


def _scaled_by_expert(op, z, slots):
    """Expert e multiplies its input by e + 1 (an empty static row, slot -1, gives zeros)."""
    return z * (slots + 1).to(z.dtype)[:, None]


@pytest.mark.parametrize("exchange", ["dynamic", "static"])
def test_moe_ep_on_one_rank_sums_every_pairs_expert_output(exchange):
    from nonstop.dist.moe import moe_ep
    from nonstop.model.moe import select_experts

    gen = torch.Generator().manual_seed(4)
    N, K = 5, 8
    x = torch.randn(N, K, generator=gen)
    logits = torch.randn(N, NANO.moe.num_experts, generator=gen)
    op = _moe_op(chunks=3)
    env = SimpleNamespace(
        buf={"moe_in": x, "moe_logits": logits, "moe_out": torch.zeros(N, K)},
        comm=None,
        exchange=exchange,
        group_rows=(N,),
    )
    moe_ep(op, env, _scaled_by_expert)
    weights, ids = select_experts(logits, None, NANO.moe)
    want = ((weights * (ids + 1)).sum(-1))[:, None] * x
    torch.testing.assert_close(env.buf["moe_out"], want, rtol=1e-5, atol=1e-6)
    assert op.attrs["load"].tolist() == torch.bincount(ids.reshape(-1), minlength=NANO.moe.num_experts).tolist()


def test_pairs_are_cut_into_contiguous_even_chunks():
    """The static capacities assume a chunk holds at most ceil(n·k / chunks) pairs, cut in (row, j) order."""
    from nonstop.dist.moe import _route

    for chunks, rows in ((3, 5), (2, 1), (4, 7)):
        op = _moe_op(chunks)
        logits = torch.randn(rows, NANO.moe.num_experts, generator=torch.Generator().manual_seed(rows))
        chunk = _route(op, logits)[4]
        P = rows * NANO.moe.top_k
        assert chunk.tolist() == sorted(chunk.tolist())
        counts = torch.bincount(chunk, minlength=chunks)
        assert int(counts.max()) <= -(-P // chunks) and len(counts) == chunks
        assert bool((counts > 0).all()) == (P >= chunks)


def test_weighted_sum_adds_in_increasing_expert_id():
    """fp32: (1e8 + -1e8) + 1 = 1 but (-1e8 + 1) + 1e8 = 0; ids [5, 9, 2] give the order 2, 5, 9."""
    from nonstop.dist.moe import weighted_sum

    y = torch.tensor([[[-1e8], [1.0], [1e8]]])  # outputs of experts 5, 9, 2
    got = weighted_sum(y, torch.ones(1, 3), torch.tensor([[5, 9, 2]]))
    assert got.tolist() == [[1.0]]
