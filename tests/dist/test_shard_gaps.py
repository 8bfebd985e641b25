"""Tensor-parallel shards of configs the other dist tests do not cut: GQA with biases and several key/value
heads per rank, replicated key/value heads, and Kimi Linear's low-rank output gate (g_a_proj / g_b_proj).
Expected parts come from the head arithmetic (rank t of T holds heads [t·H/T, (t+1)·H/T); with fewer kv
heads than ranks, the kv head h // (H / kv) its query heads h read), checked on a random state dict."""

from __future__ import annotations

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.dist import Layout, LayoutError
from nonstop.dist.load import take_shard
from nonstop.dist.shard import check_layout, local_config, rank_shards
from nonstop.weights.layout import checkpoint_layout
from nonstop.weights.synth import random_state_dict
from tests.tiny_configs import KIMI_LINEAR_LAYER_TYPES, LLAMA

HEAD_DIM = LLAMA["head_dim"]


def _llama(heads: int, kv: int) -> ModelConfig:
    raw = {**LLAMA, "num_attention_heads": heads, "num_key_value_heads": kv, "mlp_bias": True}
    return ModelConfig.from_hf_dict(raw)


def _parts(cfg: ModelConfig, lay: Layout) -> tuple[dict, dict]:
    full = random_state_dict(cfg, torch.float32, seed=1)
    parts = {
        r: {s.spec.param: take_shard(full[s.spec.param], s) for s in rank_shards(cfg, lay, r)} for r in range(lay.world)
    }
    return full, parts


@pytest.mark.parametrize("heads,kv,tp", [(4, 4, 2), (4, 2, 4), (6, 3, 3), (4, 1, 2)])
def test_gqa_parts_with_biases_are_the_ranks_heads(heads, kv, tp):
    """Catches q/k/v biases left whole while their weights are split, key/value heads cut as one head per
    rank when a rank holds several, and the wrong kv head kept when kv heads are replicated."""
    cfg = _llama(heads, kv)
    lay = Layout.make(tp=tp)
    full, parts = _parts(cfg, lay)
    for layer in range(LLAMA["num_hidden_layers"]):
        p = f"layers.{layer}.self_attn."
        for t in range(tp):
            q_lo, q_hi = t * heads // tp * HEAD_DIM, (t + 1) * heads // tp * HEAD_DIM
            if kv >= tp:
                kv_lo, kv_hi = t * kv // tp * HEAD_DIM, (t + 1) * kv // tp * HEAD_DIM
            else:
                h = (t * heads // tp) // (heads // kv)  # the kv head of this rank's first query head
                kv_lo, kv_hi = h * HEAD_DIM, (h + 1) * HEAD_DIM
            for name, (lo, hi) in {"q_proj": (q_lo, q_hi), "k_proj": (kv_lo, kv_hi), "v_proj": (kv_lo, kv_hi)}.items():
                for kind in ("weight", "bias"):
                    key = f"{p}{name}.{kind}"
                    assert torch.equal(parts[t][key], full[key][lo:hi]), f"rank {t} {key}"
            assert torch.equal(parts[t][f"{p}o_proj.weight"], full[f"{p}o_proj.weight"][:, q_lo:q_hi])
        local = {s.param: s.shape for s in checkpoint_layout(local_config(cfg, lay, 0))}
        for key in (f"{p}q_proj.bias", f"{p}k_proj.bias", f"{p}v_proj.bias"):
            assert tuple(parts[0][key].shape) == tuple(local[key])


def test_kv_heads_that_a_tp_size_divides_or_that_divide_it_are_accepted():
    """Catches the divisibility rule reduced to one direction: --tp 2 with 4 kv heads (split) and --tp 4
    with 2 kv heads (replicated) are both valid; --tp 2 with 3 kv heads is not."""
    check_layout(_llama(4, 4), Layout.make(tp=2))
    check_layout(_llama(4, 2), Layout.make(tp=4))
    with pytest.raises(LayoutError, match="num_key_value_heads = 3"):
        check_layout(_llama(6, 3), Layout.make(tp=2))


def test_kimi_linear_low_rank_gate_is_cut_by_kda_heads():
    """Catches g_b_proj (Kimi Linear's low-rank output gate, rows = KDA heads x head_dim) left whole: its
    rows must be split with the KDA heads, g_a_proj stays replicated, and every part has the shape of the
    rank's model."""
    cfg = ModelConfig.from_hf_dict({**KIMI_LINEAR_LAYER_TYPES, "num_attention_heads": 4, "num_key_value_heads": 4})
    assert not cfg.kda.full_rank_output_gate
    lay = Layout.make(tp=2)
    full, parts = _parts(cfg, lay)
    names = [k for k in full if k.endswith("g_b_proj.weight")]
    assert names
    for key in names:
        rows = full[key].shape[0]
        assert rows == cfg.kda.num_heads * cfg.kda.head_dim
        for t in range(2):
            assert torch.equal(parts[t][key], full[key][t * rows // 2 : (t + 1) * rows // 2])
            a = key.replace("g_b_proj", "g_a_proj")
            assert torch.equal(parts[t][a], full[a])
    for t in range(2):
        local = {s.param: s.shape for s in checkpoint_layout(local_config(cfg, lay, t))}
        for key, value in parts[t].items():
            if ".experts." not in key and ".shared_experts." not in key:
                assert tuple(value.shape) == tuple(local[key]), f"rank {t} {key}"


@pytest.mark.parametrize("tp", [2, 3, 4])
def test_dense_mlp_biases_follow_their_rows(tp):
    """Catches gate/up biases left whole while their rows are split (MLP with biases): rank t holds rows
    [start, stop) of the intermediate dimension, the first 68 % T parts one larger; the down projection's
    bias stays whole (added by the group's first rank only)."""
    cfg = _llama(tp * 2, tp * 2)
    lay = Layout.make(tp=tp)
    full, parts = _parts(cfg, lay)
    inter = LLAMA["intermediate_size"]
    base, extra = divmod(inter, tp)
    for t in range(tp):
        lo = t * base + min(t, extra)
        hi = lo + base + (1 if t < extra else 0)
        for name in ("gate_proj.bias", "up_proj.bias", "gate_proj.weight", "up_proj.weight"):
            key = f"layers.0.mlp.{name}"
            assert torch.equal(parts[t][key], full[key][lo:hi]), f"rank {t} {key}"
        assert torch.equal(parts[t]["layers.0.mlp.down_proj.weight"], full["layers.0.mlp.down_proj.weight"][:, lo:hi])
        assert torch.equal(parts[t]["layers.0.mlp.down_proj.bias"], full["layers.0.mlp.down_proj.bias"])


def test_a_rank_past_a_tiny_vocabulary_holds_only_pad_rows():
    """Catches a vocabulary part whose start is not clamped to V: with V = 5 and 4 ranks (2 rows each) the
    last rank holds rows [5, 5) plus 2 zero pad rows, not a negative range."""
    cfg = ModelConfig.from_hf_dict({**LLAMA, "vocab_size": 5, "num_attention_heads": 4, "num_key_value_heads": 4})
    lay = Layout.make(tp=4)
    full, parts = _parts(cfg, lay)
    embed = [parts[t]["embed_tokens.weight"] for t in range(4)]
    assert [tuple(e.shape) for e in embed] == [(2, LLAMA["hidden_size"])] * 4
    torch.testing.assert_close(torch.cat(embed)[:5], full["embed_tokens.weight"], rtol=0, atol=0)
    assert not embed[3].any() and not embed[2][1].any()


def test_rank_shards_refuses_a_rank_outside_the_world():
    """Catches a rank past the world silently given another rank's parts (rank 2 of a 2-rank layout would
    wrap to tp rank 0)."""
    with pytest.raises(LayoutError, match="rank 2 is outside the world of 2"):
        rank_shards(_llama(4, 4), Layout.make(tp=2), 2)
