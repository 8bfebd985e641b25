"""Training-loop arithmetic a second mutation audit found unpinned: the learning rate past the end of the
decay, the cosine decay's progress measured over the budget left after warmup (driven by a fake clock so
the expected rates are exact), and the balancer's bias step taken once per optimizer step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import nonstop.train.trainer as trainer
from nonstop.config import ModelConfig
from nonstop.model.moe import MoE
from nonstop.train.balance import ExpertBalancer, load_spread
from nonstop.train.batches import WindowSampler
from nonstop.train.schedule import learning_rate
from nonstop.train.trainer import TrainConfig, init_model, train
from tests.tiny_configs import KIMI_K3

CFG = ModelConfig.from_hf_dict(KIMI_K3)


def _cosine(step: int, p: float, peak: float, low: float, warmup: int) -> float:
    """The schedule of nonstop/train/schedule.py's docstring, written out independently."""
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(max(p, 0.0), 1.0)
    return low + (peak - low) * 0.5 * (1.0 + math.cos(math.pi * p))


@pytest.mark.parametrize("progress", [1.0, 1.5, 2.0, 4.0, 10.25])
def test_the_rate_stays_at_the_minimum_once_the_decay_is_over(progress):
    """Catches a dropped upper clamp of the progress: past p = 1 the cosine would climb back to the peak
    (p = 2 gives cos(2 pi) = 1, the peak again) instead of holding the minimum."""
    assert learning_rate(40, progress, 1.0, 0.1, 10) == pytest.approx(0.1)


def test_mid_decay_rates_follow_half_a_cosine():
    """Catches a wrong cosine argument (pi p / 2, 2 pi p) or a dropped 1/2: quarter points of the decay are
    min + (peak - min) (1 + cos(pi p)) / 2 by hand: 0.1 + 0.9 * {0.8536, 0.5, 0.1464}."""
    got = [learning_rate(20, p, 1.0, 0.1, 10) for p in (0.25, 0.5, 0.75)]
    want = [
        0.1 + 0.9 * (1 + math.sqrt(0.5)) / 2,
        0.55,
        0.1 + 0.9 * (1 - math.sqrt(0.5)) / 2,
    ]
    assert got == pytest.approx(want, rel=1e-12)


class _Clock:
    """A fake ``time.monotonic``: it moves on by ``dt`` seconds each time the loop draws a batch only, so at
    the top of step k (0-based) exactly k * dt seconds have gone by."""

    def __init__(self, dt: float):
        self.now = 1000.0
        self.dt = dt

    def monotonic(self) -> float:
        return self.now


def test_the_decay_spans_the_budget_left_after_warmup(monkeypatch):
    """With a clock that ticks 10 s a step, a 60 s budget and 2 warmup steps, steps 0..5 run (step 6 would
    start at the budget). Warmup ends at 20 s, so step k decays at p = (10 k - 20) / (60 - 20).
    Catches the decay progress measured over the whole budget (p never reaching 1 by the end), from the start
    of the run instead of the end of warmup, or the schedule given step + 1."""
    clock = _Clock(10.0)
    monkeypatch.setattr(trainer.time, "monotonic", clock.monotonic)
    draw = WindowSampler.next_batch

    def ticking(self):
        clock.now += clock.dt
        return draw(self)

    monkeypatch.setattr(WindowSampler, "next_batch", ticking)
    ids = np.random.default_rng(0).integers(3, CFG.vocab_size, 400).astype(np.uint16)
    tc = TrainConfig(
        minutes=1.0,
        threads=1,
        batch_size=1,
        seq_len=4,
        lr=1e-3,
        min_lr=1e-4,
        warmup_steps=2,
        log_every_s=1e9,
        eval_every_s=1e9,
    )
    result = train(init_model(CFG, seed=0), ids, None, tc, log=lambda _: None)
    assert result.steps == 6
    want = [_cosine(k, (10 * k - 20) / 40, 1e-3, 1e-4, 2) for k in range(6)]
    assert [h["lr"] for h in result.history] == pytest.approx(want, rel=1e-9)
    assert result.history[-1]["lr"] < 2.5e-4  # p = 0.75: 1e-4 + 9e-4 * 0.146 = 2.32e-4


def test_the_bias_moves_by_one_rate_per_step_towards_balance(monkeypatch):
    """Catches the trainer skipping the balancer's step, or stepping it more than once per optimizer step:
    after one training step every correction bias is rate * sign(mean - load) of that step's counts, with
    the counts recomputed here by a plain top-k over sigmoid(W x) at zero bias."""
    model = init_model(CFG, seed=0)
    inputs_seen = {}
    hooks = [
        m.register_forward_hook(lambda mod, inp, out, n=n: inputs_seen.setdefault(n, inp[0].detach().clone()))
        for n, m in model.named_modules()
        if isinstance(m, MoE)
    ]
    ids = np.random.default_rng(1).integers(3, CFG.vocab_size, 400).astype(np.uint16)
    tc = TrainConfig(
        minutes=5,
        threads=1,
        batch_size=2,
        seq_len=8,
        warmup_steps=1,
        max_steps=1,
        bias_update_rate=0.25,
    )
    weights = {n: m.gate.weight.detach().clone() for n, m in model.named_modules() if isinstance(m, MoE)}
    train(model, ids, None, tc, log=lambda _: None)
    for h in hooks:
        h.remove()
    assert inputs_seen
    for name, m in model.named_modules():
        if not isinstance(m, MoE):
            continue
        x = inputs_seen[name].reshape(-1, inputs_seen[name].shape[-1]).float()
        scores = torch.sigmoid(x @ weights[name].float().T)
        top = scores.topk(CFG.moe.top_k, dim=-1).indices
        load = torch.bincount(top.flatten(), minlength=CFG.moe.num_experts).float()
        want = 0.25 * torch.sign(load.mean() - load)
        assert torch.equal(m.gate.e_score_correction_bias.detach(), want), name


def test_the_data_order_follows_the_seed():
    """Catches the window sampler ignoring its seed (``--seed`` is documented as the seed of the weights and
    of the data order): the same seed repeats the batches, other seeds draw other ones."""
    tokens = np.arange(2000, dtype=np.uint16)

    def first_batches(seed: int) -> list[list[int]]:
        sampler = WindowSampler(tokens, seq_len=8, batch_size=4, seed=seed)
        return [sampler.next_batch()[0][:, 0].tolist() for _ in range(3)]

    assert first_batches(5) == first_batches(5)
    assert len({str(first_batches(s)) for s in (0, 1, 2, 3)}) == 4


def test_spread_is_max_over_mean_even_when_the_mean_is_below_one():
    """Catches a load_spread whose mean is clamped at one token instead of only guarded against zero: a single
    token routed to 2 of 6 experts has mean load 1/3, so max / mean is 1 / (1/3) = 3."""
    assert load_spread(torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])) == pytest.approx(3.0)


def test_a_balancer_that_counted_nothing_reports_no_spread():
    """Catches layers with an empty count reported with a spread of 0 (an empty count has no spread): before
    any training forward, the whole-run and recent spreads are empty."""
    balancer = ExpertBalancer(init_model(CFG, seed=0))
    balancer.step()
    assert balancer.spreads() == {} and balancer.recent_spreads() == {}
    balancer.remove()


def test_loads_count_the_experts_the_biased_router_picks_summed_over_forwards():
    """Catches loads counted without the correction bias (the router selects by s + b), or a count that keeps
    only the last forward pass of a step: with random biases and two training forwards, each layer's count is
    a plain top-k of sigmoid(W x) + b, recomputed here, over both passes."""
    model = init_model(CFG, seed=0)
    gen = torch.Generator().manual_seed(0)
    moes = {n: m for n, m in model.named_modules() if isinstance(m, MoE)}
    with torch.no_grad():
        for m in moes.values():
            m.gate.e_score_correction_bias.copy_(torch.randn(CFG.moe.num_experts, generator=gen) * 0.5)
    seen: dict[str, list[torch.Tensor]] = {n: [] for n in moes}
    hooks = [
        m.register_forward_hook(lambda mod, inp, out, n=n: seen[n].append(inp[0].detach())) for n, m in moes.items()
    ]
    balancer = ExpertBalancer(model)
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randint(3, CFG.vocab_size, (2, 6), generator=gen))
    for h in hooks:
        h.remove()
    for name, m in moes.items():
        want = torch.zeros(CFG.moe.num_experts)
        for x in seen[name]:
            x = x.reshape(-1, x.shape[-1]).float()
            choice = torch.sigmoid(x @ m.gate.weight.float().T) + m.gate.e_score_correction_bias.float()
            want += torch.bincount(choice.topk(CFG.moe.top_k, dim=-1).indices.flatten(), minlength=len(want)).float()
        assert torch.equal(balancer.loads[name], want), name
    balancer.remove()


def test_periodic_evaluations_score_windows_of_seq_len(monkeypatch):
    """Catches the periodic held-out evaluation run with another context than --seq-len: after one step, the
    logged NLL of 16 held-out targets is the mean cross-entropy of two independent windows of 8, by hand."""
    model = init_model(CFG, seed=0)
    rng = np.random.default_rng(2)
    ids = rng.integers(3, CFG.vocab_size, 400).astype(np.uint16)
    heldout = rng.integers(3, CFG.vocab_size, 40).astype(np.uint16)
    tc = TrainConfig(
        minutes=5, threads=1, batch_size=2, seq_len=8, warmup_steps=1, max_steps=1, eval_every_s=0.0, eval_tokens=16
    )
    result = train(model, ids, heldout, tc, log=lambda _: None)
    h = torch.as_tensor(heldout.astype(np.int64))
    total = 0.0
    with torch.no_grad():
        for s in (0, 8):
            logits = model(h[s : s + 8][None])[0]
            total += torch.nn.functional.cross_entropy(logits, h[s + 1 : s + 9], reduction="sum").item()
    assert result.evals[0]["heldout_nll"] == pytest.approx(total / 16, abs=2e-4)


def test_adamw_runs_with_the_documented_epsilon(monkeypatch):
    """Catches a changed AdamW epsilon (1e-8): the optimiser the loop builds is created with eps 1e-8."""
    made = []

    class Spy(torch.optim.AdamW):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(trainer.torch.optim, "AdamW", Spy)
    ids = np.random.default_rng(0).integers(3, CFG.vocab_size, 400).astype(np.uint16)
    tc = TrainConfig(minutes=5, threads=1, batch_size=1, seq_len=4, warmup_steps=1, max_steps=1)
    train(init_model(CFG, seed=0), ids, None, tc, log=lambda _: None)
    assert [g["eps"] for g in made[0].param_groups] == [1e-8, 1e-8]


def test_whole_run_and_end_spreads_are_over_their_own_steps(monkeypatch):
    """Catches the result's whole-run spread and end spread taken from the wrong counts (one for the other):
    with an evaluation after every step, the end spread is max/mean of the last step's loads and the whole-run
    spread max/mean of the loads summed over all steps (loads recorded here as each step applies them)."""
    steps: list[dict[str, torch.Tensor]] = []
    apply = ExpertBalancer.step

    def recording(self):
        steps.append({n: load.clone() for n, load in self.loads.items()})
        apply(self)

    monkeypatch.setattr(ExpertBalancer, "step", recording)
    rng = np.random.default_rng(4)
    ids = rng.integers(3, CFG.vocab_size, 400).astype(np.uint16)
    heldout = rng.integers(3, CFG.vocab_size, 20).astype(np.uint16)
    tc = TrainConfig(
        minutes=5, threads=1, batch_size=2, seq_len=8, warmup_steps=1, max_steps=3, eval_every_s=0.0, eval_tokens=8
    )
    result = train(init_model(CFG, seed=0), ids, heldout, tc, log=lambda _: None)
    assert len(steps) == 3
    for name in steps[0]:
        whole = sum(s[name] for s in steps)
        last = steps[-1][name]
        assert result.expert_load_spread[name] == pytest.approx(float(whole.max() / whole.mean()), abs=1e-3)
        assert result.expert_load_spread_end[name] == pytest.approx(float(last.max() / last.mean()), abs=1e-3)
    assert result.expert_load_spread != result.expert_load_spread_end  # the two differ in this run


def test_gradients_are_clipped_by_their_global_l2_norm(monkeypatch):
    """Catches clipping by another norm (L1, max): with --grad-clip far below the gradient's size, the
    gradients AdamW receives have a global L2 norm (sqrt of the sum of squares, over every parameter) of
    exactly the clip, and the logged grad_norm is the L2 norm before clipping (above the clip)."""
    norms = []

    class Spy(torch.optim.AdamW):
        def step(self, closure=None):
            grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
            norms.append(math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads)))
            return super().step(closure)

    monkeypatch.setattr(trainer.torch.optim, "AdamW", Spy)
    ids = np.random.default_rng(0).integers(3, CFG.vocab_size, 400).astype(np.uint16)
    tc = TrainConfig(minutes=5, threads=1, batch_size=2, seq_len=8, warmup_steps=1, max_steps=1, grad_clip=1e-3)
    result = train(init_model(CFG, seed=0), ids, None, tc, log=lambda _: None)
    assert norms == pytest.approx([1e-3], rel=1e-4)
    assert result.history[0]["grad_norm"] > 1e-2
