"""A tied checkpoint (``tie_word_embeddings: true``) that also carries an ``lm_head.weight`` differing from
its embedding must be refused on every load path. The whole-model loader refuses it (``check_tied_head``
with ``values=True``); the per-rank loader used by ``--tp`` / ``--ep`` runs (``dist.load.load_rank_state``)
only checks the header shapes, so it silently drops the checkpoint's own LM head and the distributed model
computes different logits from the single-process one (or from what the checkpoint's author meant)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from nonstop.config import ModelConfig
from nonstop.dist.layout import Layout
from nonstop.dist.load import load_rank_state
from nonstop.weights.errors import CheckpointError
from nonstop.weights.layout import checkpoint_layout
from nonstop.weights.loader import load_state_dict
from tests.tiny_configs import LLAMA

RAW = {**LLAMA, "hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 8}


def _tied_checkpoint(tmp_path, head_differs: bool):
    """A tied llama checkpoint written with the safetensors package, plus an ``lm_head.weight`` that is either
    a copy of the embedding or different values of the same shape."""
    cfg = ModelConfig.from_hf_dict(RAW)
    assert cfg.tie_word_embeddings
    gen = torch.Generator().manual_seed(0)
    tensors = {n: torch.randn(s.hf_shape, generator=gen) for s in checkpoint_layout(cfg) for n in s.names}
    embed = tensors["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = embed + 1.0 if head_differs else embed.clone()
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(RAW))
    save_file(tensors, str(d / "model.safetensors"))
    return cfg, d


def test_the_whole_model_loader_refuses_a_differing_tied_head(tmp_path):
    """Baseline: the single-process loader names the LM head that config.json would silently drop."""
    cfg, d = _tied_checkpoint(tmp_path, head_differs=True)
    with pytest.raises(CheckpointError, match=r"'lm_head.weight' in model.safetensors differs"):
        load_state_dict(cfg, d, torch.float32)


@pytest.mark.parametrize(("tp", "rank"), [(1, 0), (2, 0), (2, 1)])
def test_every_rank_refuses_a_differing_tied_head(tmp_path, tp, rank):
    """Catches the per-rank loader skipping the tied-head value check: it loads the checkpoint and ignores
    its different LM head, where the whole-model loader refuses it (a --tp/--ep run and a single-process
    run of the same directory would disagree)."""
    cfg, d = _tied_checkpoint(tmp_path, head_differs=True)
    with pytest.raises(CheckpointError, match=r"lm_head.weight"):
        load_rank_state(cfg, Layout.make(tp=tp), rank, d, torch.float32)


@pytest.mark.parametrize("tp", [1, 2])
def test_a_tied_head_that_is_a_copy_still_loads_on_every_rank(tmp_path, tp):
    """A copy of the embedding as LM head is accepted by the per-rank loader (the fix must not refuse it)."""
    cfg, d = _tied_checkpoint(tmp_path, head_differs=False)
    for rank in range(tp):
        state = load_rank_state(cfg, Layout.make(tp=tp), rank, d, torch.float32)
        assert "lm_head.weight" not in state and "embed_tokens.weight" in state
