"""Cost-model figures the other tests leave open, each checked against hand arithmetic on k3-nano's config
(nonstop/assets/k3-nano: d 256, vocab 6144, KDA 4 heads x 32 dims, conv 4; MLA 4 heads, kv_lora 64, rope 16,
v 32, output gate; MoE 8 experts, top-2, intermediate 128, latent 128; AttnRes blocks of 3 layers): several
rows per sequence (speculative verification), more expert picks than experts, key splits at their edge, the
collective super-ops of a rank's Program, and the preflight's cache cap and disk lookup."""

from __future__ import annotations

import shutil

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.build import meta_model
from nonstop.program.lower import lower

NANO = ModelConfig.from_file("nonstop/assets/k3-nano")
BF16 = 2  # bytes per element of the model dtype used below
D = 256
C, H, HD, K = 128, 4, 32, 4  # KDA channels (H x HD), heads, head dim, conv taps
N, L, R, V = 4, 64, 16, 32  # MLA heads, kv_lora, rope dims, v dims
E, TOP_K, I, Z = 8, 2, 128, 128  # experts, top-k, expert intermediate, latent width


@pytest.fixture(scope="module")
def ops():
    program = lower(meta_model(NANO, torch.bfloat16))
    return {op.name: op for op in program.ops}


def test_the_config_is_the_one_the_arithmetic_assumes():
    k, m, e = NANO.kda, NANO.mla, NANO.moe
    assert (NANO.hidden_size, k.num_heads, k.head_dim, k.conv_size, k.full_rank_output_gate) == (D, H, HD, K, True)
    assert (m.num_heads, m.kv_lora_rank, m.qk_rope_head_dim, m.v_head_dim, m.output_gate) == (N, L, R, V, True)
    assert (e.num_experts, e.top_k, e.intermediate_size, e.latent_size) == (E, TOP_K, I, Z)
    assert NANO.attn_types[3] == "mla" and NANO.attn_types[0] == "kda" and NANO.mlp_types[1] == "moe"
    assert NANO.attn_res_block_size == 3


def test_mla_attention_reads_each_sequences_context_once_and_every_new_row_once(ops):
    """2 sequences x 4 rows at context 10: keys read = 2*10 cached + 8 new, each (kv_lora + rope) bf16 values."""
    rows, seqs, context = 8, 2, 10
    w_uv = N * L * V * BF16
    act_in = N * L * 4 + N * R * BF16 + N * V * BF16  # q_lat (fp32), q_pe, output gate
    keys = seqs * context + rows
    got = ops["L3.mla_attn"].cost(rows, context, seqs)
    assert got.bytes_read == w_uv + rows * act_in + keys * (L + R) * BF16
    assert got.bytes_written == rows * N * V * BF16


def test_mla_q_up_appends_one_cache_entry_per_row(ops):
    rows, seqs = 8, 2
    out = N * L * 4 + N * R * BF16  # q_lat fp32, q_pe
    assert ops["L3.mla_q_up"].cost(rows, 10, seqs).bytes_written == rows * out + rows * (L + R) * BF16


def test_kda_state_is_read_and_written_once_per_sequence_not_per_row(ops):
    """kda_core: fp32 state [H, HD, HD] per sequence; kda_in_proj: conv windows [3, C, K-1] per sequence."""
    rows, seqs = 6, 2
    state = H * HD * HD * 4
    core = ops["L0.kda_core"].cost(rows, 5, seqs)
    assert core.bytes_written == rows * C * BF16 + seqs * state
    acts = (C + C + C + C + H + HD) * BF16  # q, k, v, the full-rank output gate, beta, f_a
    weights = sum(t.numel() * t.element_size() for t in ops["L0.kda_core"].weights.values())
    assert core.bytes_read == weights + rows * acts + seqs * state
    window = 3 * C * (K - 1) * BF16
    proj = ops["L0.kda_in_proj"].cost(rows, 5, seqs)
    assert proj.bytes_written == rows * acts + seqs * window
    assert proj.bytes_read - proj.weight_bytes == rows * D * BF16 + seqs * window


def test_without_sequences_every_row_is_its_own_sequence(ops):
    rows = 3
    state = H * HD * HD * 4
    assert ops["L0.kda_core"].cost(rows, 5).bytes_written == rows * C * BF16 + rows * state
    for op in ops.values():
        assert op.cost(rows, 7) == op.cost(rows, 7, rows), op.name


def test_an_attnres_mix_that_stores_a_block_writes_it(ops):
    """L0's attention mix stores block 0 (the embedding) besides writing x; L0's FFN mix stores nothing."""
    rows = 3
    assert ops["L0.attn_mix"].attrs["store_block"] == 0 and ops["L0.ffn_mix"].attrs["store_block"] is None
    assert ops["L0.attn_mix"].cost(rows).bytes_written == rows * D * BF16 + rows * D * BF16
    assert ops["L0.ffn_mix"].cost(rows).bytes_written == rows * D * BF16


def test_expert_flops_count_every_pick_when_picks_outnumber_the_experts(ops):
    """5 rows x top-2 = 10 (row, expert) pairs > 8 experts: the bytes cap at the 8 experts, the work does not."""
    rows = 5
    per_expert = 3 * I * Z  # gate, up, down
    op = ops["L1.moe_experts"]
    got = op.cost(rows)
    assert got.flops == 2 * per_expert * rows * TOP_K
    assert got.weight_bytes == E * per_expert * BF16 + op.weights["bias"].numel() * op.weights["bias"].element_size()
    assert op.tiles(rows) == E * (I // 64)  # every expert once, its intermediate rows in tiles of 64
    assert op.tiles(3) == 3 * TOP_K * (I // 64)


@pytest.mark.parametrize("context, splits", [(254, 1), (255, 1), (256, 2), (511, 2), (512, 3)])
def test_mla_key_splits_count_the_new_token(ops, context, splits):
    """One token at context c attends c + 1 keys, in splits of 256; one combine tile per head."""
    assert ops["L3.mla_attn"].tiles(1, context, 1) == 1 * 1 * splits + N  # 4 (token, head) items: one block


def _rank_ops(tp, ep, world):
    from nonstop.dist import Layout
    from nonstop.dist.program import shapes_program

    program = shapes_program(NANO, Layout.make(tp, ep, world), 0, torch.float32)
    return {op.name: op for op in program.ops}


def test_a_vocab_shard_gathers_its_share_of_the_rows():
    """--tp 2: each rank's embedding part holds half the vocabulary, so it gathers rows / 2 rows on average."""
    op = _rank_ops(2, 1, 2)["embed"]
    assert op.kind == "embed_shard"
    assert op.cost(4).weight_bytes == 4 * D * 4 // 2


def test_expert_parallel_weights_count_only_the_experts_a_step_reaches():
    """--ep 2: rank 0 holds 4 of the 8 experts; one row per group, 2 groups of the expert group route 2
    picks each, so rank 0 expects 2 * 2 * 4 / 8 = 2 pairs: it streams 2 experts, not all 4."""
    op = _rank_ops(1, 2, 2)["L1.moe_ep"]
    assert op.attrs["local_experts"] == 4
    bias = op.weights["bias"].numel() * op.weights["bias"].element_size()
    assert op.cost(1).weight_bytes == 2 * 3 * I * Z * 4 + bias
    assert op.tiles(1) == 2 * (I // 64)


def test_preflight_counts_at_most_max_positions_of_cache():
    from nonstop.program.footprint import Footprint
    from nonstop.program.preflight import footprint_bytes

    fp = Footprint(0, 0, 0, weight_bytes=1000, bytes_per_token=0, cache_bytes_per_token=100, state_bytes_per_sequence=7)
    assert footprint_bytes(fp, max_positions=512, slots=2, cache_tokens=1024) == (1000, 2 * (7 + 512 * 100))
    assert footprint_bytes(fp, max_positions=4096, slots=2, cache_tokens=1024) == (1000, 2 * (7 + 1024 * 100))


def test_free_disk_of_a_path_several_levels_from_existing(tmp_path):
    from nonstop.program.preflight import free_disk

    got = free_disk(tmp_path / "a" / "b" / "c" / "model")
    assert abs(got - shutil.disk_usage(tmp_path).free) < 1 << 30


def _fake_cgroup(monkeypatch, tmp_path, files: dict[str, str]):
    """Point the preflight's /sys/fs/cgroup reads at ``files`` under tmp_path."""
    import pathlib

    import nonstop.program.preflight as preflight

    for name, text in files.items():
        target = tmp_path / name.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    monkeypatch.setattr(preflight, "Path", lambda p: pathlib.Path(tmp_path / str(p).lstrip("/")))


def test_cgroup_v2_room_is_the_limit_less_the_usage(monkeypatch, tmp_path):
    import nonstop.program.preflight as preflight

    _fake_cgroup(
        monkeypatch, tmp_path, {"/sys/fs/cgroup/memory.max": "8000\n", "/sys/fs/cgroup/memory.current": "4500\n"}
    )
    assert preflight._cgroup_free() == 3500
    _fake_cgroup(monkeypatch, tmp_path, {"/sys/fs/cgroup/memory.current": "9000\n"})  # over the limit: none left
    assert preflight._cgroup_free() == 0


def test_cgroup_without_a_limit_bounds_nothing(monkeypatch, tmp_path):
    import nonstop.program.preflight as preflight

    _fake_cgroup(monkeypatch, tmp_path, {"/sys/fs/cgroup/memory.max": "max\n", "/sys/fs/cgroup/memory.current": "1\n"})
    assert preflight._cgroup_free() is None


def test_host_memory_is_bounded_by_the_cgroup(monkeypatch):
    import nonstop.program.preflight as preflight

    monkeypatch.setattr(preflight, "_cgroup_free", lambda: 12345)
    assert preflight.available_memory(torch.device("cpu")) == 12345
