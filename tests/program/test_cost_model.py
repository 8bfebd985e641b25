"""The cost model (``program/cost.py``) and its footprint view (``program/footprint.py``) against counts made
without them, on every family: the tensors of a built model, a checkpoint written to disk, the caches'
real buffers, torch's FLOP counter on a reference decode step (plus, for the KDA families, the elementwise
work it cannot see, counted from the model's shapes), and each op's tiles counted from the shapes and
``TILE_N``."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from nonstop.cache.state import ModelCache
from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.program import cost
from nonstop.program.footprint import footprint, model_footprint
from nonstop.program.lower import lower
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import TINY_CONFIGS

DTYPES = (torch.float32, torch.bfloat16)


@pytest.fixture(scope="module", params=list(TINY_CONFIGS))
def cfg(request):
    return ModelConfig.from_hf_dict(TINY_CONFIGS[request.param])


def streamed_bytes(model, rows: int) -> int:
    """Weight bytes a step of ``rows`` rows reads, counted from the model's own tensors: the embedding
    gives one row per token, at most its whole table (and, tied, is the whole LM head), routed experts
    count for the distinct min(E, rows·top_k) experts, an attention-residual query is folded from its norm
    and projection into one d-vector, and every rotary layer reads its frequencies."""
    cfg = model.cfg
    total, seen = 0, set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen or name.endswith("_res_proj.weight"):  # folded into the *_res_norm vector
            continue
        seen.add(id(t))
        nbytes = t.numel() * t.element_size()
        if name == "embed_tokens.weight":
            total += min(rows, t.shape[0]) * t.shape[1] * t.element_size() + (nbytes if cfg.tie_word_embeddings else 0)
        elif ".experts." in name:
            experts = cfg.moe.num_experts
            total += nbytes // experts * min(experts, rows * cfg.moe.top_k)
        else:
            total += nbytes
    rotary = [m.rotary for m in model.modules() if getattr(m, "rotary", None) is not None]  # one per layer
    return total + sum(r.inv_freq.numel() * r.inv_freq.element_size() for r in rotary)


@pytest.mark.parametrize("dtype", DTYPES)
def test_streamed_weight_bytes_equal_the_models_tensors(cfg, dtype):
    model = random_model(cfg, dtype)
    program = lower(model)
    for rows in (1, 2, 5, cfg.vocab_size + 3):  # more rows than the table has: the table, once
        assert program.total_cost(rows=rows, context=7).weight_bytes == streamed_bytes(model, rows), rows
    assert footprint(model, program).bytes_per_token == streamed_bytes(model, 1)


def _checkpoint_counts(path) -> tuple[int, int]:
    """(tensor bytes, weight values) of a safetensors checkpoint, from its header alone."""
    nbytes = values = 0
    for file in sorted(path.glob("*.safetensors")):
        with open(file, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            start, end = entry["data_offsets"]
            nbytes += end - start
            n = 1
            for s in entry["shape"]:
                n *= s
            values += (
                0 if name.endswith("_scale") or name.endswith("scales") else (2 * n if entry["dtype"] == "U8" else n)
            )
    return nbytes, values


@pytest.mark.parametrize("dtype", DTYPES)
def test_totals_equal_a_checkpoint_on_disk(cfg, dtype, tmp_path):
    path = write_checkpoint(cfg, tmp_path / "ckpt", seed=1, dtype=dtype)
    nbytes, values = _checkpoint_counts(path)
    fp = model_footprint(cfg, dtype)
    assert (fp.weight_bytes, fp.total_params) == (nbytes, values)
    embedding = cfg.vocab_size * cfg.hidden_size
    assert fp.embedding_params == embedding
    idle = 0
    if cfg.moe is not None:  # routed experts the token does not select
        model = random_model(cfg, dtype)
        experts = sum(cost.weight_elements(n, t) for n, t in model.state_dict().items() if ".experts." in n)
        idle = experts * (cfg.moe.num_experts - cfg.moe.top_k) // cfg.moe.num_experts
    assert fp.active_params == values - embedding - idle + (embedding if cfg.tie_word_embeddings else 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cache_and_state_bytes_equal_the_caches_buffers(cfg, dtype):
    slots, capacity = 3, 32
    cache = ModelCache(cfg, slots, capacity=capacity, dtype=dtype)
    per_token = per_sequence = 0
    for layer in cache.layers:
        if hasattr(layer, "tensors"):  # paged attention cache: a pool of token rows
            per_token += sum(t[0].numel() * t.element_size() for t in layer.tensors.values())
        else:
            per_sequence += sum(t[0].numel() * t.element_size() for t in (layer.recurrent, layer.conv))
    fp = model_footprint(cfg, dtype)
    assert (fp.cache_bytes_per_token, fp.state_bytes_per_sequence) == (per_token, per_sequence)


@pytest.mark.parametrize("tokens", (1, 4))
def test_attention_reads_each_sequences_cache_once_whatever_its_rows(cfg, tokens):
    """B sequences of T rows each (T - 1 verified drafts) at context L: the attention ops together read
    B·L cached tokens, counted from the cache's real buffers, however large T is."""
    dtype = torch.bfloat16
    cache = ModelCache(cfg, 3, capacity=32, dtype=dtype)
    per_token = sum(
        sum(t[0].numel() * t.element_size() for t in layer.tensors.values())
        for layer in cache.layers
        if hasattr(layer, "tensors")
    )
    program = lower(random_model(cfg, dtype))
    seqs, context = 3, 37
    rows = seqs * tokens
    at_context = program.total_cost(rows, context, seqs).bytes_read
    at_zero = program.total_cost(rows, 0, seqs).bytes_read
    assert at_context - at_zero == seqs * context * per_token
    one_row_each = program.total_cost(seqs, context, seqs).bytes_read - program.total_cost(seqs, 0, seqs).bytes_read
    assert one_row_each == at_context - at_zero  # the verified rows share their sequence's keys


def test_flops_equal_torchs_count_where_every_flop_is_a_matmul():
    """llama and deepseek_v3 decode steps are matmuls only (attention included); torch's counter sees
    them all. (KDA's state update, short conv and the AttnRes mixes are elementwise work that the
    counter does not see, so those families are checked on bytes only.)"""
    for name in ("llama", "deepseek_v3"):
        cfg = ModelConfig.from_hf_dict(TINY_CONFIGS[name])
        model = random_model(cfg, torch.float32, seed=3)
        program = lower(random_model(cfg, torch.float32, seed=3))
        for context in (1, 6):
            cache = ModelCache(cfg, 2, capacity=16)
            ids = torch.randint(0, cfg.vocab_size, (2, context + 1), generator=torch.Generator().manual_seed(0))
            prefill = cache.batch([0, 1], context)
            model(ids[:, :context], cache, prefill)
            cache.advance(prefill)
            with FlopCounterMode(display=False) as counter:
                model(ids[:, context:], cache, cache.batch([0, 1], 1), last_only=True)
            assert program.total_cost(rows=2, context=context).flops == counter.get_total_flops(), (name, context)


def _decode_flops_seen_by_torch(model, cfg, context: int) -> tuple[int, list[tuple[int, int]]]:
    """(torch's FLOP count of a 2-sequence decode step after ``context`` cached tokens, the (sources, rows)
    of every attention-residual mix the reference model runs in that step)."""
    import nonstop.model.stack as stack

    mixes = []
    mix = stack.attn_res_mix

    def recording(sources, query, eps):
        mixes.append((len(sources), sources[0][..., 0].numel()))
        return mix(sources, query, eps)

    cache = ModelCache(cfg, 2, capacity=16)
    ids = torch.randint(0, cfg.vocab_size, (2, context + 1), generator=torch.Generator().manual_seed(0))
    prefill = cache.batch([0, 1], context)
    model(ids[:, :context], cache, prefill)
    cache.advance(prefill)
    stack.attn_res_mix = recording
    try:
        with FlopCounterMode(display=False) as counter:
            model(ids[:, context:], cache, cache.batch([0, 1], 1), last_only=True)
    finally:
        stack.attn_res_mix = mix
    return counter.get_total_flops(), mixes


@pytest.mark.parametrize("name", ["kimi_linear", "kimi_k3"])
def test_flops_of_the_kda_families_equal_torchs_count_plus_the_elementwise_work(name):
    """Kimi Linear and K3: torch's counter sees every matmul (KDA's q·S and k·S included); the work it cannot
    see is elementwise and counted here from the model's own shapes: the KDA state's rank-one update
    S += k ⊗ u (a multiply-add per state element, H·D·D per row and layer) and each attention-residual
    mix the reference runs (a dot product and a weighted sum over each of its S sources: 4·S·d per row;
    a one-source mix, which the model short-circuits, still runs in its super-op)."""
    cfg = ModelConfig.from_hf_dict(TINY_CONFIGS[name])
    model = random_model(cfg, torch.float32, seed=3)
    program = lower(random_model(cfg, torch.float32, seed=3))
    rows = 2
    kda_layers = sum(t == "kda" for t in cfg.attn_types)
    state_update = kda_layers * rows * 2 * cfg.kda.num_heads * cfg.kda.head_dim**2
    for context in (1, 6):
        seen, mixes = _decode_flops_seen_by_torch(model, cfg, context)
        attnres = sum(4 * sources * n * cfg.hidden_size for sources, n in mixes)
        assert (name == "kimi_k3") == bool(mixes)
        assert program.total_cost(rows=rows, context=context).flops == seen + state_update + attnres, context


def expected_tiles(kind: str, cfg: ModelConfig, rows: int, seqs: int, context: int) -> int:
    """The tiles of an op of ``kind`` counted from the model's shapes: a GEMV pass over a weight of N output
    rows is ceil(N / TILE_N) tiles; attention one per (sequence, head), MLA's in blocks of query items and
    key splits plus one combine per head; row-wise ops one per row."""
    per = lambda n: -(-n // cost.TILE_N)  # noqa: E731
    d = cfg.hidden_size
    if kind in ("embed", "attnres_mix_norm"):
        return rows
    if kind in ("linear_residual", "moe_tail"):  # o_proj / the MoE's last projection write a hidden row
        return per(d)
    if kind == "lm_head":
        return per(cfg.vocab_size)
    if kind == "mlp":  # gate|up pass over the intermediate rows, then down
        return per(cfg.intermediate_size) + per(d)
    if kind == "gqa_qkv_rope":
        return cfg.gqa.num_heads + 2 * cfg.gqa.num_kv_heads
    if kind == "gqa_attn":
        return seqs * cfg.gqa.num_kv_heads
    if kind in ("mla_in_proj", "mla_q_up", "mla_attn"):
        m = cfg.mla
        if kind == "mla_q_up":
            return m.num_heads + 1
        if kind == "mla_attn":
            tokens = rows // seqs
            splits = -(-(context + tokens) // cost.ATTN_SPLIT_KEYS)
            return seqs * -(-tokens * m.num_heads // cost.ATTN_BLOCK_M) * splits + m.num_heads
        q = m.q_lora_rank or m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        gate = m.num_heads * m.v_head_dim if m.output_gate else 0
        return per(q + m.kv_lora_rank + m.qk_rope_head_dim + gate)
    if kind == "kda_in_proj":  # q, k, v, the output gate (full rank or its rank-D down-projection), beta, f_a
        k = cfg.kda
        hd = k.num_heads * k.head_dim
        return per(3 * hd + (hd if k.full_rank_output_gate else k.head_dim) + k.num_heads + k.head_dim)
    if kind == "kda_core":
        return seqs * cfg.kda.num_heads
    mc = cfg.moe
    if kind == "moe_front":  # router, the experts' input row (latent or hidden), the shared experts' gate|up
        shared = per(mc.num_shared_experts * mc.intermediate_size) if mc.num_shared_experts else 0
        return per(mc.num_experts) + per(mc.latent_size or d) + shared
    assert kind == "moe_experts", kind
    return min(mc.num_experts, rows * mc.top_k) * per(mc.intermediate_size)


@pytest.mark.parametrize("preset", ["llama-3.2-1b", "kimi-k2", "kimi-linear-48b-a3b", "kimi-k3"])
def test_tiles_equal_a_count_from_the_shapes(preset):
    """``op.tiles`` of every op of a preset's Program (real shapes, a weightless model) against
    ``expected_tiles``, at batch 1, several rows of one sequence, and many sequences past a key split."""
    from nonstop.model.build import meta_model

    c = ModelConfig.preset(preset)
    program = lower(meta_model(c, torch.bfloat16))
    assert {op.kind for op in program.ops} <= set(cost._TILES)
    for rows, seqs, context in ((1, 1, 0), (5, 1, 40), (16, 16, 300), (12, 4, 1000)):
        for op in program.ops:
            got = op.tiles(rows, context, seqs)
            assert got == expected_tiles(op.kind, c, rows, seqs, context), (op.name, rows, seqs, context)


def test_attention_flops_count_each_verified_row_causally():
    """A sequence's rows in one step (speculative verification) see their cached keys and the new tokens up
    to their own: row t scores context + t + 1 keys. Every row was counted at context + 1, so 4 rows of one
    sequence after 6 cached tokens were 28 (row, key) pairs instead of 7 + 8 + 9 + 10 = 34. torch's counter
    sees the dense masked matrix (40 pairs), so the check is by hand: one sequence of 4 rows against 4 of one
    row, which differ only in those 6 pairs per attention layer."""
    from nonstop.program.cost import attended_keys

    assert attended_keys(4, 1, 6) == 7 + 8 + 9 + 10
    assert attended_keys(4, 4, 6) == 4 * 7
    assert attended_keys(5, 2, 0) == (1 + 2 + 3) + (1 + 2)  # rows split 3 + 2
    assert attended_keys(3, 0, 4) == 3 * 5  # no sequence: each row on its own (the planner's per-row probe)
    for name in ("llama", "deepseek_v3"):
        cfg = ModelConfig.from_hf_dict(TINY_CONFIGS[name])
        program = lower(random_model(cfg, torch.float32, seed=3))
        if name == "llama":
            per_pair = 4 * cfg.gqa.num_heads * cfg.gqa.head_dim
        else:
            per_pair = 2 * cfg.mla.num_heads * (cfg.mla.cache_dim + cfg.mla.kv_lora_rank)
        layers = len(cfg.attn_types)
        one_sequence = program.total_cost(rows=4, context=6, sequences=1).flops
        four_sequences = program.total_cost(rows=4, context=6, sequences=4).flops
        assert one_sequence - four_sequences == 6 * layers * per_pair, name
