"""The cost model (``program/cost.py``) and its footprint view (``program/footprint.py``) against counts made
without them, on every family: the tensors of a built model, a checkpoint written to disk, the caches'
real buffers and torch's FLOP counter on a reference decode step."""

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
    gives one row per token (and, tied, is the whole LM head), routed experts count for the distinct
    min(E, rows·top_k) experts, an attention-residual query is folded from its norm and projection into
    one d-vector, and every rotary layer reads its frequencies."""
    cfg = model.cfg
    total, seen = 0, set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen or name.endswith("_res_proj.weight"):  # folded into the *_res_norm vector
            continue
        seen.add(id(t))
        nbytes = t.numel() * t.element_size()
        if name == "embed_tokens.weight":
            total += rows * t.shape[1] * t.element_size() + (nbytes if cfg.tie_word_embeddings else 0)
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
    for rows in (1, 2, 5):
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
