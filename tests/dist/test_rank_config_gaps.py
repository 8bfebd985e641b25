"""Gaps a second mutation audit of ``dist/shard.py`` found: the
config a rank builds its model with (``local_config``) for an all-dense model, checked against the head and
intermediate arithmetic of ``shard.py``'s docstring (rank t of T: heads H / T, intermediate part of
``split_range``, ceil(V / T) vocabulary rows)."""

from __future__ import annotations

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.dist import Layout
from nonstop.dist.load import take_shard
from nonstop.dist.shard import local_config, rank_shards
from nonstop.weights.synth import random_state_dict
from tests.tiny_configs import DEEPSEEK, LLAMA


@pytest.mark.parametrize("tp, inter", [(2, [34, 34]), (3, [23, 23, 22]), (4, [17, 17, 17, 17])])
def test_an_all_dense_models_ranks_build_their_part_of_the_mlp(tp, inter):
    """Llama (every layer dense, intermediate 68, 12 heads and kv heads, vocabulary 131): rank t of tp T
    builds an MLP of its own intermediate part (68 split in parts differing by one, the first 68 % T
    larger). Catches the intermediate size left whole in the rank's config when the model has no MoE
    layer (its weights are split but the module is built full size)."""
    cfg = ModelConfig.from_hf_dict({**LLAMA, "num_attention_heads": 12, "num_key_value_heads": 12})
    assert set(cfg.mlp_types) == {"dense"}
    lay = Layout.make(tp=tp)
    for t in range(tp):
        local = local_config(cfg, lay, t)
        assert local.intermediate_size == inter[t], (t, local.intermediate_size)
        assert local.gqa.num_heads == 12 // tp
        assert local.vocab_size == -(-131 // tp)


def test_shared_experts_are_split_over_the_attention_group():
    """DeepSeek (shared expert of intermediate 20, tp 3): rank t holds rows [7t, ...) of the shared gate/up
    (parts 7, 7, 6) and the same columns of the shared down projection, whose partial sums the tp all-reduce
    adds. Catches the shared experts held whole on every rank (their output then counted T times)."""
    cfg = ModelConfig.from_hf_dict(DEEPSEEK)
    lay = Layout.make(tp=3)
    full = random_state_dict(cfg, torch.float32, seed=2)
    bounds = [(0, 7), (7, 14), (14, 20)]
    for t, (lo, hi) in enumerate(bounds):
        part = {s.spec.param: take_shard(full[s.spec.param], s) for s in rank_shards(cfg, lay, t)}
        for layer in (1, 2):
            key = f"layers.{layer}.mlp.shared_experts."
            for name in ("gate_proj.weight", "up_proj.weight"):
                assert torch.equal(part[key + name], full[key + name][lo:hi]), (t, key + name)
            down = key + "down_proj.weight"
            assert torch.equal(part[down], full[down][:, lo:hi]), (t, down)


def test_a_placement_describes_its_fewest_and_most_experts_per_rank():
    """8 experts over 3 ranks hold 3, 3 and 2: "2-3 per rank"; one redundant replica on top is counted.
    Catches the range's low end taken as the maximum ("3-3 per rank": the uneven rank hidden)."""
    from nonstop.dist.placement import ExpertPlacement

    assert ExpertPlacement.even(8, 3).describe() == "8 experts on 3 ranks (2-3 per rank)"
    extra = ExpertPlacement(3, ((0, 1), (2, 0)))
    assert extra.describe() == "3 experts on 2 ranks (2-2 per rank, 1 redundant)"
