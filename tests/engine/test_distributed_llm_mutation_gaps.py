"""Gaps a mutation audit of ``engine/distributed_llm.py`` found: only rank 0 builds it, the device argument is
checked, ``max_batch`` is kept and sizes rank 0's preflight (every slot's cache), a DSpark drafter that is
missing is refused before anything loads, and ``TargetHead`` holds the target's own embedding and LM head
(untied: two tensors; tied: one), compared with the single process's random weights. No process group:
``build_worker`` is replaced."""

from __future__ import annotations

import types

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.dist.layout import Layout
from nonstop.engine import layout_preflight
from nonstop.engine.layout_preflight import rank_bytes
from nonstop.program.preflight import PreflightError
from nonstop.weights.resolve import resolve_model
from nonstop.weights.synth import random_state_dict
from tests.tiny_configs import KIMI_K3, LLAMA


class Loading(Exception):
    pass


@pytest.fixture
def distributed_llm(monkeypatch):
    import nonstop.engine.distributed_llm as module

    def build_worker(*args, **kwargs):
        raise Loading

    monkeypatch.setattr(module, "build_worker", build_worker)
    return module


def _comm(rank: int = 0, device: str = "cpu", layout: Layout | None = None):
    return types.SimpleNamespace(rank=rank, layout=layout or Layout.make(2, 1, 2), device=torch.device(device))


def test_only_rank_0_builds_it(distributed_llm):
    with pytest.raises(ValueError, match="DistributedLLM runs on rank 0; rank 1 follows"):
        distributed_llm.DistributedLLM("k3-nano", comm=_comm(rank=1))


def test_the_device_is_checked(distributed_llm):
    with pytest.raises(ValueError, match="device 'nonsense' is not a device torch knows"):
        distributed_llm.DistributedLLM("k3-nano", device="nonsense", comm=_comm(), preflight=False)


def test_rank_0s_preflight_counts_every_slot(distributed_llm, monkeypatch):
    """TP 2 alone (DP 1): rank 0 keeps the caches of all max_batch slots."""
    cfg = resolve_model("k3-nano")[0]
    layout = Layout.make(2, 1, 2)
    weights, cache = rank_bytes(cfg, layout, [0], torch.float32, 1)[0]
    monkeypatch.setattr(layout_preflight, "available_memory", lambda device: weights + cache)
    comm = _comm(device="cuda", layout=layout)
    with pytest.raises(Loading):  # one sequence fits
        distributed_llm.DistributedLLM("k3-nano", dtype="float32", comm=comm, max_batch=1)
    with pytest.raises(PreflightError, match=r"cache for 2 sequence\(s\)"):
        distributed_llm.DistributedLLM("k3-nano", dtype="float32", comm=comm, max_batch=2)


def test_max_batch_is_kept(monkeypatch):
    import nonstop.engine.distributed_llm as module

    comm = types.SimpleNamespace(
        rank=0, layout=Layout.make(2, 1, 2), device=torch.device("cpu"), timeout=60.0, broadcast_object=lambda *a: None
    )
    worker = types.SimpleNamespace(comm=comm, executor=types.SimpleNamespace(backend="reference"))
    monkeypatch.setattr(module, "build_worker", lambda *args, **kwargs: worker)
    llm = module.DistributedLLM("k3-nano", dtype="float32", comm=comm, max_batch=3, preflight=False)
    try:
        assert llm.max_batch == 3 and llm.layout is comm.layout
    finally:
        llm.close()


def test_a_missing_drafter_is_refused_before_loading(distributed_llm):
    with pytest.raises(ValueError, match="no config.json in the drafter directory /nonexistent"):
        distributed_llm.DistributedLLM(
            "k3-nano", comm=_comm(), preflight=False, speculative={"method": "dspark", "drafter": "/nonexistent"}
        )


def test_before_load_runs_with_config_and_tokenizer_before_any_weight(distributed_llm):
    """``before_load(llm)`` (``nonstop generate --tp``'s request checks) sees the config, tokenizer and
    speculative options, and a refusal there stops the build before the rank worker loads anything."""
    seen = []

    def before_load(llm):
        seen.append((llm.cfg.max_position_embeddings, llm.tokenizer.accepts_text, llm.speculative_config.method))
        raise ValueError("prompt too long")

    with pytest.raises(ValueError, match="prompt too long"):
        distributed_llm.DistributedLLM(
            "k3-nano", comm=_comm(), preflight=False, speculative={"method": "ngram"}, before_load=before_load
        )
    assert seen == [(resolve_model("k3-nano")[0].max_position_embeddings, True, "ngram")]
    with pytest.raises(Loading):  # a check that passes: the worker is built next
        distributed_llm.DistributedLLM("k3-nano", comm=_comm(), preflight=False, before_load=lambda llm: None)


@pytest.mark.parametrize("raw", [KIMI_K3, LLAMA], ids=["untied", "tied"])
def test_target_head_holds_the_targets_embedding_and_lm_head(raw):
    from nonstop.engine.distributed_llm import TargetHead

    cfg = ModelConfig.from_hf_dict(raw)
    whole = random_state_dict(cfg, torch.float32, seed=3)
    head = TargetHead(cfg, None, torch.float32, torch.device("cpu"), seed=3)
    assert torch.equal(head.embed_tokens.weight, whole["embed_tokens.weight"])
    if cfg.tie_word_embeddings:
        assert "lm_head.weight" not in whole and head.lm_head_weight is head.embed_tokens.weight
    else:
        assert torch.equal(head.lm_head_weight, whole["lm_head.weight"])
        assert not torch.equal(head.lm_head_weight, head.embed_tokens.weight)
