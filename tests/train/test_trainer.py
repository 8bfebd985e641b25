"""The training loop and its helpers on a tiny K3 config (seconds, CPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.build import load_model
from nonstop.train.balance import ExpertBalancer, bias_update, load_spread
from nonstop.train.batches import WindowSampler
from nonstop.train.export import save_checkpoint
from nonstop.train.schedule import learning_rate
from nonstop.train.trainer import TrainConfig, init_model, param_groups, train
from tests.tiny_configs import KIMI_K3

CFG = ModelConfig.from_hf_dict(KIMI_K3)


def _pattern_stream(n: int, vocab: int, seed: int = 0) -> np.ndarray:
    """A learnable stream: fixed random 'sentences' of 12 ids, repeated in random order."""
    rng = np.random.default_rng(seed)
    sentences = rng.integers(3, vocab, size=(6, 12))
    order = rng.integers(0, len(sentences), size=n // 12 + 1)
    return sentences[order].reshape(-1)[:n].astype(np.uint16)


def test_training_lowers_the_loss():
    torch.manual_seed(0)
    model = init_model(CFG, seed=0)
    ids = _pattern_stream(6000, CFG.vocab_size)
    tc = TrainConfig(
        minutes=5,
        threads=1,
        batch_size=4,
        seq_len=16,
        lr=1e-2,
        min_lr=1e-2,
        warmup_steps=3,
        max_steps=30,
        log_every_s=1e9,
        eval_every_s=1e9,
    )
    result = train(model, ids, None, tc, log=lambda _: None)
    assert result.steps == 30 and result.tokens == 30 * 4 * 16
    first = np.mean([h["loss"] for h in result.history[:5]])
    last = np.mean([h["loss"] for h in result.history[-5:]])
    assert result.history[0]["loss"] > math.log(CFG.vocab_size) - 0.3  # starts near uniform
    assert last < 0.5 * first, (first, last)
    assert not model.training


def test_time_budget_stops_the_loop():
    model = init_model(CFG, seed=0)
    tc = TrainConfig(
        minutes=0.5 / 60, threads=1, batch_size=2, seq_len=16, warmup_steps=1, log_every_s=1e9, eval_every_s=1e9
    )
    result = train(model, _pattern_stream(2000, CFG.vocab_size), None, tc, log=lambda _: None)
    assert result.steps >= 1 and result.wall_s < 5.0


def test_bias_update_favours_underloaded_experts():
    bias = torch.zeros(4)
    bias_update(bias, torch.tensor([10.0, 0.0, 5.0, 5.0]), rate=1e-3)
    assert bias.tolist() == pytest.approx([-1e-3, 1e-3, 0.0, 0.0])
    assert load_spread(torch.tensor([10.0, 0.0, 5.0, 5.0])) == pytest.approx(2.0)


def test_balancer_counts_routed_tokens_and_moves_the_bias():
    model = init_model(CFG, seed=0)
    balancer = ExpertBalancer(model, rate=0.01)
    ids = torch.randint(0, CFG.vocab_size, (2, 10))
    model.train()
    model(ids)
    k = CFG.moe.top_k
    assert set(balancer.loads) == {f"layers.{i}.mlp" for i in range(CFG.num_hidden_layers) if CFG.mlp_types[i] == "moe"}
    for load in balancer.loads.values():
        assert load.sum().item() == 2 * 10 * k
    name = next(iter(balancer.loads))
    load = balancer.loads[name].clone()
    balancer.step()
    bias = balancer.moes[name].gate.e_score_correction_bias
    assert bias.requires_grad is False
    assert torch.equal(bias, 0.01 * torch.sign(load.mean() - load))
    assert all(l.sum() == 0 for l in balancer.loads.values())
    model.eval()
    model(ids)  # evaluation passes are not counted
    assert all(l.sum() == 0 for l in balancer.loads.values())
    balancer.remove()


def test_correction_bias_is_not_optimised():
    model = init_model(CFG, seed=0)
    opt_params = {id(p) for g in param_groups(model, 0.1) for p in g["params"]}
    for name, p in model.named_parameters():
        assert (id(p) in opt_params) == (not name.endswith("e_score_correction_bias")), name
        if name.endswith("e_score_correction_bias"):
            assert torch.count_nonzero(p) == 0


def test_window_sampler_visits_every_target_once_per_epoch():
    tokens = np.arange(1000, dtype=np.uint16)
    sampler = WindowSampler(tokens, seq_len=10, batch_size=7, seed=3)
    x, y = sampler.next_batch()
    assert x.shape == y.shape == (7, 10) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    seen = [y]
    while sampler.epoch == 1 and sampler._next < len(sampler._starts):
        seen.append(sampler.next_batch()[1])
    targets = torch.cat(seen).flatten()[: len(sampler._starts) * 10]
    assert len(set(targets.tolist())) == len(targets)  # no target twice within the epoch


def test_learning_rate_schedule():
    assert learning_rate(0, 0.0, 1.0, 0.1, 10) == pytest.approx(0.1)
    assert learning_rate(9, 0.0, 1.0, 0.1, 10) == pytest.approx(1.0)
    assert learning_rate(10, 0.0, 1.0, 0.1, 10) == pytest.approx(1.0)
    assert learning_rate(50, 0.5, 1.0, 0.1, 10) == pytest.approx(0.55)
    assert learning_rate(99, 1.0, 1.0, 0.1, 10) == pytest.approx(0.1)
    assert learning_rate(99, 3.0, 1.0, 0.1, 10) == pytest.approx(0.1)


def test_checkpoint_round_trip(tmp_path):
    model = init_model(CFG, seed=1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                p.copy_(torch.randn_like(p) * 0.1)
    model.eval()
    save_checkpoint(model, tmp_path, dtype=torch.float32)
    loaded = load_model(CFG, tmp_path, torch.float32)
    ids = torch.randint(0, CFG.vocab_size, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))
    assert {"config.json", "generation_config.json", "model.safetensors"} <= {p.name for p in tmp_path.iterdir()}
