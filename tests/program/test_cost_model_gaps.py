"""Cost-model figures that the other program tests leave open, each against hand arithmetic on k3-nano's
config (nonstop/assets/k3-nano: d 256; MLA 4 heads; MoE 8 experts, top-2, latent 128; AttnRes blocks of 3
layers) and on the collective super-ops of a rank's Program (fp32 shapes): the weights an AttnRes mix
streams, the keys a multi-token step splits over, and the collectives' own traffic and work."""

from __future__ import annotations

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.build import meta_model
from nonstop.program import cost
from nonstop.program.lower import lower

NANO = ModelConfig.from_file("nonstop/assets/k3-nano")
BF16, FP32, INT64 = 2, 4, 8
D = 256
N = 4  # MLA heads
Z = 128  # the MoE latent width (moe_in row)


@pytest.fixture(scope="module")
def ops():
    program = lower(meta_model(NANO, torch.bfloat16))
    return {op.name: op for op in program.ops}


def _rank_ops(tp, ep, world, chunks=1, exchange="dynamic"):
    from nonstop.dist import Layout
    from nonstop.dist.program import shapes_program

    program = shapes_program(NANO, Layout.make(tp, ep, world), 0, torch.float32, chunks, exchange)
    return {op.name: op for op in program.ops}


def test_an_attnres_mix_reads_its_own_weights():
    """The mix streams its query and norm vectors (two bf16 d-vectors) besides its sources: dropping the
    weights from bytes_read would make a K3 step look cheaper than it is."""
    program = lower(meta_model(NANO, torch.bfloat16))
    op = {o.name: o for o in program.ops}["L3.ffn_mix"]
    assert op.attrs["n_blocks"] == 2  # blocks 0 and 1 stored by L0 and L3, plus the partial sum
    rows = 3
    got = op.cost(rows)
    assert got.weight_bytes == 2 * D * BF16
    assert got.bytes_read == 2 * D * BF16 + rows * 3 * D * BF16


@pytest.mark.parametrize("context, splits", [(252, 1), (253, 2), (508, 2), (509, 3)])
def test_mla_key_splits_count_every_token_of_the_step(ops, context, splits):
    """4 rows of one sequence at context c attend c + 4 keys (their own new tokens included), in splits of
    256: at c = 253 that is 257 keys, two splits (counting only c + 1 keys gives one). 4 tokens x 4 heads
    = 16 (token, head) items: one block of 32; plus one combine tile per head."""
    assert ops["L3.mla_attn"].tiles(4, context, 1) == 1 * 1 * splits + N


def test_mla_tiles_of_rows_split_unevenly_over_sequences(ops):
    """5 rows over 2 sequences are sequences of 3 and 2 tokens (the step's even split); at context 254 the
    3-token one attends 257 keys (2 splits of 256), the 2-token one 256 (1 split); each has one query block
    (3·4 and 2·4 items of 32): 2 + 1 tiles, plus a combine tile per head. Flooring 5 / 2 to 2 tokens each
    counted 2 tiles; 0 sequences (a row's own cost) is each row alone: 5 one-split tiles."""
    assert ops["L3.mla_attn"].tiles(5, 254, 2) == 2 + 1 + N
    assert ops["L3.mla_attn"].tiles(5, 254, 0) == 5 * 1 + N


def test_all_gather_sends_the_other_ranks_parts():
    """A ring all-gather of n parts of P bytes: each rank forwards n - 1 parts (its own one and n - 2
    received), (n - 1)·P bytes; the planner prices logits / query / MoE-input gathers with it."""
    assert cost.all_gather_wire_bytes(1000, 4) == 3000
    assert cost.all_gather_wire_bytes(1000, 1) == 0
    assert cost.all_gather_wire_bytes(64, 2) == 64


def test_a_vocab_shard_reads_its_ids_and_writes_whole_hidden_rows():
    """--tp 2 (fp32): the embedding shard gathers rows / 2 table rows on average, reads each row's int64 id
    and writes a whole d-wide fp32 row per token (zeros where the id is another rank's)."""
    op = _rank_ops(2, 1, 2)["embed"]
    assert op.kind == "embed_shard"
    rows = 4
    got = op.cost(rows)
    weight = rows * D * FP32 // 2
    assert got.bytes_read == weight + rows * INT64
    assert got.bytes_written == rows * D * FP32


def test_a_tensor_parallel_all_reduce_adds_every_element_it_reduces():
    """--tp 2: an all-reduce of R rows of d fp32 values adds the peer's partial into each of the R·d
    elements (R·d FLOPs), reading and writing the R rows once."""
    op = _rank_ops(2, 1, 2)["embed.all_reduce"]
    assert op.kind == "tp_all_reduce"
    rows = 4
    got = op.cost(rows)
    assert got.flops == rows * D
    assert (got.weight_bytes, got.bytes_read, got.bytes_written) == (0, rows * D * FP32, rows * D * FP32)


def test_the_static_exchange_moves_whole_buffers_both_ways():
    """--ep 2 over 2 ranks (each its own attention group), 3 rows, 1 chunk: each rank routes 3 rows x top-2
    = 6 pairs and holds 4 of the 8 experts, so every per-peer buffer holds min(6, 3·min(2, 4)) = 6 rows;
    sent = received = 12 buffer rows. Each is written with its int32 slot id and z row, then its output row
    comes back: 12 + 12 rows x (2·z + 4) bytes, read and written. The dynamic exchange moves exactly the
    pairs: 6 sent + 2·3·2·4/8 = 6 received, one z row each. The weights are the same in both modes."""
    z = Z * FP32
    dynamic = _rank_ops(1, 2, 2)["L1.moe_ep"].cost(3)
    static_op = _rank_ops(1, 2, 2, exchange="static")["L1.moe_ep"]
    assert static_op.attrs["exchange"] == "static"
    static = static_op.cost(3)
    assert static.weight_bytes == dynamic.weight_bytes
    extra = (12 + 12) * (2 * z + 4) - (6 + 6) * z
    assert static.bytes_read - dynamic.bytes_read == extra
    assert static.bytes_written - dynamic.bytes_written == extra


def test_the_router_logits_and_expert_sums_stay_fp32_in_a_bf16_program(ops):
    """moe_front writes the router logits (8 experts) and zeroes the experts' fp32 accumulator (z = 128
    values, split-K atomics need fp32) whatever the model dtype; moe_in and the shared experts' activation
    (128 wide) are bf16: 8·4 + 128·2 + 128·4 + 128·2 bytes a row."""
    program = lower(meta_model(NANO, torch.bfloat16))
    assert program.buffers["moe_logits"].dtype == "float32" and program.buffers["moe_out"].dtype == "float32"
    assert NANO.moe.shared_intermediate_size == 128
    rows = 3
    assert ops["L1.moe_front"].cost(rows).bytes_written == rows * (8 * FP32 + Z * BF16 + Z * FP32 + 128 * BF16)


def test_static_capacity_counts_the_distinct_experts_a_peer_holds():
    """A peer holding two slots of each of experts 6 and 7 (4 slots, 2 distinct experts) can take at most
    2 of a row's top-4 (distinct) experts: 3 rows -> at most 3·2 = 6 pairs, not 3·4 = 12 (the chunk bound,
    ceil(3·4 / 1) = 12, does not bind). Rank 0 holds experts 0..5, six distinct: min(4, 6) = 4 a row."""
    from types import SimpleNamespace

    from nonstop.dist.placement import ExpertPlacement

    placement = ExpertPlacement(8, ((0, 1, 2, 3, 4, 5), (6, 7, 6, 7)))
    attrs = dict(ep_ranks=2, ep_rank=0, top_k=4, chunks=1, tp_ranks=1, rank=0, placement=placement)
    send, recv = cost.static_splits(SimpleNamespace(attrs=attrs), (3, 3))
    assert send == [12, 6]
    assert recv == [12, 12]


def test_expected_pairs_round_up_to_whole_experts():
    """--ep 3 over 3 ranks (fp32): rank 0 holds 3 of the 8 experts; 3 ranks route 1 row x top-2 each, so it
    expects 3·2·3/8 = 2.25 pairs: a fractional pair still streams a whole expert, 3 experts (not 2) of
    gate|up|down 3·128·128 fp32 values, plus the 8 fp32 correction biases; 3 x 128/64 GEMV tiles."""
    op = _rank_ops(1, 3, 3)["L1.moe_ep"]
    assert (op.attrs["local_experts"], op.attrs["physical_experts"]) == (3, 8)
    assert op.cost(1).weight_bytes == 3 * 3 * 128 * Z * FP32 + 8 * FP32
    assert op.tiles(1) == 3 * (128 // 64)
    # the work follows the 2.25 pairs received (it sends only 2): 2 FLOPs per expert value per pair
    assert op.cost(1).flops == 2 * (3 * 128 * Z) * 9 // 4


def test_expert_parallel_flops_skip_the_mxfp4_block_scales():
    """MXFP4 experts under --ep 2: each packed byte holds two weight values, the E8M0 block scales none, so
    a rank's expected 2 pairs (1 row x top-2 from each of 2 ranks, half of the experts here) cost
    2 · (3·128·128 values) · 2 FLOPs."""
    import dataclasses

    from nonstop.dist import Layout
    from nonstop.dist.program import shapes_program

    cfg = NANO.replace(moe=dataclasses.replace(NANO.moe, expert_format="mxfp4"))
    program = shapes_program(cfg, Layout.make(1, 2, 2), 0, torch.bfloat16)
    op = {o.name: o for o in program.ops}["L1.moe_ep"]
    assert any(n.endswith("_scale") for n in op.weights)
    assert op.cost(1).flops == 2 * (3 * 128 * Z) * 2


def test_without_expert_parallelism_the_experts_exchange_nothing():
    """--tp 2 with one expert rank: every rank holds every expert, so its moe_ep op runs no all-to-all at all
    (not all-to-alls of zero bytes, which the rank view would list as launches)."""
    from nonstop.dist import Layout
    from nonstop.dist.program import shapes_program

    program = shapes_program(NANO, Layout.make(2, 1, 2), 0, torch.float32)
    op = {o.name: o for o in program.ops}["L1.moe_ep"]
    assert op.attrs["ep_ranks"] == 1
    assert cost.op_collectives(op, program, 4) == []


def test_a_single_process_engine_broadcasts_nothing():
    """world 1: rank 0 has no one to send the step inputs to, so it runs no broadcast (a zero-byte one would
    still be listed as a launch); world 2: one peer gets 4 rows x 24 bytes + the 256-byte header."""
    assert cost.step_io_collectives(1, 1, True, False, 4, 100) == []
    (bcast,) = cost.step_io_collectives(2, 2, True, False, 4, 100)
    assert (bcast.kind, bcast.ranks, bcast.wire_bytes) == ("broadcast", 2, 1 * (24 * 4 * 2 + 256))


def test_the_moe_tail_reads_the_shared_experts_activation(ops):
    """moe_tail reads the fp32 expert sum and moe_in (128 wide each; fp32 and bf16) and the shared experts'
    128-wide bf16 activation for their down projection: 128·4 + 128·2 + 128·2 bytes a row beside its weights."""
    op = ops["L1.moe_tail"]
    assert "shared_down" in op.weights
    weights = sum(t.numel() * t.element_size() for t in op.weights.values())
    rows = 3
    assert op.cost(rows).bytes_read == weights + rows * (Z * FP32 + Z * BF16 + 128 * BF16)
