"""Training-side behaviours a mutation audit found unpinned: the window sampler's epochs (every target once,
a random phase and order, whole batches across an epoch's end, a stream too short refused), the balancer's
whole-run and recent load counts, the token stream's EOS ids and its cache key, and the optimiser the loop
builds (decay groups, betas, a step's gradient alone, clipping, divergence, periodic evaluations)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import nonstop.train.trainer as trainer
from nonstop.config import ModelConfig
from nonstop.train.balance import ExpertBalancer
from nonstop.train.batches import WindowSampler
from nonstop.train.tokenizer import save_tokenizer, train_tokenizer
from nonstop.train.tokens import cached_token_ids, encode_documents, load_tokenizer
from nonstop.train.trainer import TrainConfig, TrainingDiverged, init_model, param_groups, train
from nonstop.weights.resolve import ASSETS
from tests.tiny_configs import KIMI_K3

CFG = ModelConfig.from_hf_dict(KIMI_K3)
TOKENIZER = ASSETS / "k3-nano"


def _epoch_targets(sampler: WindowSampler) -> list[int]:
    """Targets of the batches drawn until the sampler's first epoch is used up (epoch 1 only)."""
    targets = []
    while True:
        _, y = sampler.next_batch()
        targets += y.flatten().tolist()
        if sampler._next >= len(sampler._starts):
            return targets


def test_windows_of_one_token_predict_every_id_after_the_first_once_per_epoch():
    """seq_len 1 has a single phase (0): the epoch is the N - 1 windows (x_i, x_i+1), so targets are ids 1..N-1."""
    tokens = np.arange(20, dtype=np.uint16)
    sampler = WindowSampler(tokens, seq_len=1, batch_size=1, seed=0)
    assert sorted(_epoch_targets(sampler)) == list(range(1, 20))


def test_each_epoch_starts_at_a_random_phase_and_visits_windows_in_a_random_order():
    tokens = np.arange(1000, dtype=np.uint16)
    sampler = WindowSampler(tokens, seq_len=10, batch_size=1, seed=0)
    phases, orders = set(), []
    for _ in range(6):
        starts = []
        while True:
            x, _ = sampler.next_batch()
            starts.append(int(x[0, 0]))
            if sampler._next >= len(sampler._starts):
                break
        phases.add(starts[0] % 10)
        assert len({s % 10 for s in starts}) == 1  # one phase per epoch: windows of an epoch do not overlap
        orders.append(starts)
    assert len(phases) > 1, phases  # the phase is drawn from [0, seq_len), not always 0
    assert all(o != sorted(o) for o in orders)  # shuffled, not in stream order


def test_a_batch_that_crosses_an_epochs_end_still_has_batch_size_windows():
    tokens = np.arange(100, dtype=np.uint16)  # 9 or 10 windows of 10 an epoch: batches of 4 cross its end
    sampler = WindowSampler(tokens, seq_len=10, batch_size=4, seed=1)
    for _ in range(12):
        x, y = sampler.next_batch()
        assert x.shape == y.shape == (4, 10)


def test_epochs_done_counts_the_fraction_of_the_stream_visited():
    tokens = np.arange(1000, dtype=np.uint16)
    sampler = WindowSampler(tokens, seq_len=10, batch_size=1, seed=0)
    assert sampler.epochs_done == 0.0
    sampler.next_batch()
    assert sampler.epochs_done == pytest.approx(1 / len(sampler._starts))
    _epoch_targets(sampler)
    assert sampler.epochs_done == pytest.approx(1.0)


@pytest.mark.parametrize("seq_len", [4, 16])
def test_a_stream_too_short_for_a_window_at_every_phase_is_refused(seq_len):
    """At phase seq_len - 1 a stream of 2 * seq_len - 1 ids holds no whole window: an epoch would be empty and
    next_batch would loop for ever."""
    with pytest.raises(ValueError, match=rf"has {2 * seq_len - 1} token ids; .* need at least {2 * (seq_len + 1)}"):
        WindowSampler(np.arange(2 * seq_len - 1, dtype=np.uint16), seq_len=seq_len, batch_size=1)


def _routed(balancer: ExpertBalancer) -> dict[str, torch.Tensor]:
    return {name: load.clone() for name, load in balancer.loads.items()}


def _max_over_mean(load: torch.Tensor) -> float:
    return (load.max() / load.mean()).item()


def test_whole_run_and_recent_spreads_are_max_over_mean_of_the_summed_counts():
    torch.manual_seed(0)
    model = init_model(CFG, seed=0).train()
    balancer = ExpertBalancer(model, rate=0.5)  # large steps: the loads of successive steps differ
    windows = []
    for _ in range(3):
        model(torch.randint(0, CFG.vocab_size, (2, 12)))
        windows.append(_routed(balancer))
        balancer.step()
    whole = {name: sum(w[name] for w in windows) for name in windows[0]}
    assert balancer.spreads() == pytest.approx({n: _max_over_mean(v) for n, v in whole.items()})
    assert balancer.recent_spreads() == pytest.approx({n: _max_over_mean(v) for n, v in whole.items()})
    model(torch.randint(0, CFG.vocab_size, (2, 12)))
    last = _routed(balancer)
    balancer.step()
    # the recent window restarted at the last call: only the step since counts
    assert balancer.recent_spreads() == pytest.approx({n: _max_over_mean(v) for n, v in last.items()})
    balancer.remove()


def _two_documents(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("A list is mutable.\n<|eos|>\nTo open a file, call open().\n<|eos|>\n", encoding="utf-8")
    return path


def test_every_document_is_followed_by_the_eos_id(tmp_path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    eos = tok.token_to_id("<|eos|>")
    expected = (
        tok.encode("A list is mutable.", add_special_tokens=False).ids
        + [eos]
        + tok.encode("To open a file, call open().", add_special_tokens=False).ids
        + [eos]
    )
    ids = encode_documents(_two_documents(tmp_path), load_tokenizer(TOKENIZER))
    assert ids.dtype == np.uint16 and ids.tolist() == expected


def test_a_tokenizer_without_an_eos_token_is_refused(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    with pytest.raises(ValueError, match="no <\\|eos\\|> token"):
        encode_documents(_two_documents(tmp_path), tok)


def test_a_new_tokenizer_is_not_served_the_old_tokenizers_cache(tmp_path):
    text = _two_documents(tmp_path)
    first = cached_token_ids(text, TOKENIZER, tmp_path / "tokens")
    other = tmp_path / "tok"
    save_tokenizer(train_tokenizer(["A list is mutable. To open a file."] * 4, vocab_size=270), other)
    again = cached_token_ids(text, other, tmp_path / "tokens")
    assert again.tolist() == encode_documents(text, load_tokenizer(other)).tolist()
    assert again.tolist() != first.tolist()


def test_a_cache_file_of_another_dtype_is_tokenized_again(tmp_path, capsys):
    text = _two_documents(tmp_path)
    good = cached_token_ids(text, TOKENIZER, tmp_path / "tokens")
    (cache,) = (tmp_path / "tokens").iterdir()
    np.save(cache, good.astype(np.int64) + 7)  # readable, but not a uint16 stream
    again = cached_token_ids(text, TOKENIZER, tmp_path / "tokens")
    assert again.dtype == np.uint16 and again.tolist() == good.tolist()
    assert "is unreadable" in capsys.readouterr().err


def test_weight_decay_falls_on_matrices_only():
    model = init_model(CFG, seed=0)
    groups = param_groups(model, 0.25)
    decay = {id(p) for g in groups if g["weight_decay"] == 0.25 for p in g["params"]}
    plain = {id(p) for g in groups if g["weight_decay"] == 0.0 for p in g["params"]}
    for name, p in model.named_parameters():
        if name.endswith("e_score_correction_bias"):
            continue
        assert (id(p) in decay) == (p.dim() >= 2) and (id(p) in plain) == (p.dim() < 2), name


def _stream(n: int = 3000) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(3, CFG.vocab_size, size=n).astype(np.uint16)


def _tc(**kw) -> TrainConfig:
    base = dict(threads=1, batch_size=2, seq_len=8, warmup_steps=1, log_every_s=1e9, eval_every_s=1e9)
    return TrainConfig(**{**base, **kw})


def _grad(p: torch.Tensor) -> torch.Tensor:
    """p's gradient, zeros where none reached it (an expert no token picked)."""
    return torch.zeros_like(p) if p.grad is None else p.grad.detach()


class _SpyAdamW(torch.optim.AdamW):
    """AdamW that records its betas and, at every step, the gradients it is about to apply."""

    made: list[_SpyAdamW] = []

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.betas = kw.get("betas")
        self.grads: list[list[torch.Tensor]] = []
        _SpyAdamW.made.append(self)

    def step(self, closure=None):
        self.grads.append([_grad(p).clone() for g in self.param_groups for p in g["params"]])
        return super().step(closure)


@pytest.fixture
def spy_adamw(monkeypatch):
    _SpyAdamW.made = []
    monkeypatch.setattr(trainer.torch.optim, "AdamW", _SpyAdamW)
    return _SpyAdamW.made


def test_adamw_gets_beta1_then_beta2(spy_adamw):
    train(init_model(CFG, seed=0), _stream(), None, _tc(max_steps=1, beta1=0.8, beta2=0.99), log=lambda _: None)
    assert spy_adamw[0].betas == (0.8, 0.99)


def test_gradients_are_clipped_to_the_global_norm(spy_adamw):
    train(init_model(CFG, seed=0), _stream(), None, _tc(max_steps=2, grad_clip=1e-3), log=lambda _: None)
    for grads in spy_adamw[0].grads:
        assert torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])) <= 1e-3 * 1.01


def test_a_step_applies_the_gradient_of_its_own_batch_alone(spy_adamw, monkeypatch):
    """Step 2's gradient is that of step 2's batch under the weights step 1 left (none of step 1's is left over)."""
    states = []
    step = _SpyAdamW.step

    def keep_weights(self, closure=None):
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return step(self, closure)

    monkeypatch.setattr(_SpyAdamW, "step", keep_weights)
    model = init_model(CFG, seed=0)
    ids = _stream()
    tc = _tc(max_steps=2, grad_clip=1e9)
    train(model, ids, None, tc, log=lambda _: None)
    sampler = WindowSampler(ids, tc.seq_len, tc.batch_size, tc.seed)
    sampler.next_batch()
    inputs, targets = sampler.next_batch()
    fresh = init_model(CFG, seed=0)
    fresh.load_state_dict(states[1])
    logits = fresh(inputs)
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
    expected = [_grad(p) for g in param_groups(fresh, tc.weight_decay) for p in g["params"]]
    got = spy_adamw[0].grads[1]
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)


def test_a_loss_that_is_not_finite_stops_the_run(monkeypatch):
    def nan_loss(model, inputs, targets):
        return model(inputs).sum() * float("nan")

    monkeypatch.setattr(trainer, "next_token_loss", nan_loss)
    with pytest.raises(TrainingDiverged, match="lower --lr"):
        train(init_model(CFG, seed=0), _stream(), None, _tc(max_steps=3), log=lambda _: None)


def test_periodic_evaluations_score_eval_tokens_and_log_their_perplexity():
    lines = []
    heldout = _stream(200)
    result = train(
        init_model(CFG, seed=0),
        _stream(),
        heldout,
        _tc(max_steps=2, eval_every_s=0.0, eval_tokens=10),
        log=lines.append,
    )
    assert len(result.evals) == 2
    for e in result.evals:
        assert e["heldout_ppl"] == pytest.approx(math.exp(e["heldout_nll"]), rel=1e-3)
    evals = [line for line in lines if line.startswith("eval")]
    assert evals and all("held-out (10 tokens)" in line for line in evals)


def test_the_cosine_decay_starts_at_the_end_of_warmup():
    """Warmup ramps to the peak; the first step after it runs at the peak (decay progress 0, measured from the
    end of warmup), the ones after below it and above the minimum."""
    tc = _tc(max_steps=5, warmup_steps=2, lr=1e-3, min_lr=1e-4, minutes=0.2)
    result = train(init_model(CFG, seed=0), _stream(), None, tc, log=lambda _: None)
    lrs = [h["lr"] for h in result.history]
    assert lrs[:3] == pytest.approx([0.5e-3, 1e-3, 1e-3], rel=1e-12)
    assert all(1e-4 < lr < 1e-3 for lr in lrs[3:]), lrs
    assert lrs[3] > lrs[4]


def test_the_first_step_is_logged_and_epochs_are_the_fraction_of_the_stream_seen():
    lines = []
    ids = _stream(3001)  # 3000 targets: windows of 8, about 375 an epoch
    result = train(init_model(CFG, seed=0), ids, None, _tc(max_steps=3, log_every_s=1e9), log=lines.append)
    assert [line.split("|")[0].split() for line in lines] == [["step", "1"]]  # progress right away, then by time
    assert result.epochs == pytest.approx(3 * 2 / 375, rel=0.01)  # 3 steps of 2 windows
