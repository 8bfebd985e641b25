"""Train a ``CausalLM`` on a token stream for a wall-clock budget.

One step: a batch of packed windows (``batches.WindowSampler``), fp32 forward of the model's own
layers (``CausalLM.forward`` without a cache: KDA in its chunked form), next-token cross-entropy
  L = −(1/BT) Σ_{b,t} log softmax(logits[b, t])[y_{b,t}],
backward, global gradient-norm clipping, AdamW (decoupled weight decay on matrices only), then the
aux-loss-free expert-bias update (``balance.ExpertBalancer``). The learning rate follows
``schedule.learning_rate`` over the time budget, so the run stops on time even on a busy machine.
Held-out loss is measured with the engine's perplexity scorer (``nonstop.engine.perplexity``).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from nonstop.config import ModelConfig
from nonstop.engine.perplexity import score_token_ids
from nonstop.model.build import random_model
from nonstop.model.kda import KDAAttention
from nonstop.model.stack import CausalLM
from nonstop.program.preflight import allocation_failed
from nonstop.train.balance import ExpertBalancer
from nonstop.train.batches import WindowSampler
from nonstop.train.schedule import learning_rate


class TrainingDiverged(ValueError):
    """The loss stopped being finite: a setting to change (the learning rate), not a bug."""


class TrainingOutOfMemory(ValueError):
    """A step's activations did not fit in memory: a setting to change (batch size, sequence length), not a bug."""


@dataclass
class TrainConfig:
    minutes: float = 40.0  # wall-clock budget of the optimisation loop (final eval and save come after)
    threads: int = 2
    batch_size: int = 8
    seq_len: int = 256
    kda_chunk_size: int = 16  # KDA chunked-form block (same math; 16 is ~1.7x faster than 32 on CPU)
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup_steps: int = 30
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    bias_update_rate: float = 1e-2  # γ of the expert-bias update (1e-3 let the router collapse within ~50 steps)
    log_every_s: float = 30.0
    eval_every_s: float = 300.0
    eval_tokens: int = 4096  # held-out ids scored by the periodic evaluations (the final one scores all)
    seed: int = 0
    max_steps: int | None = None  # stop earlier than the budget (tests, smoke runs)


@dataclass
class TrainResult:
    steps: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    epochs: float = 0.0
    history: list[dict] = field(default_factory=list)  # per step: step, tokens, elapsed_s, loss, lr, grad_norm
    evals: list[dict] = field(default_factory=list)  # step, tokens, elapsed_s, heldout_nll, heldout_ppl
    expert_load_spread: dict[str, float] = field(default_factory=dict)  # layer -> max/mean load, whole run
    # the same over the steps after the last evaluation (the last evaluation's window if none came after)
    expert_load_spread_end: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def check_trainable(cfg: ModelConfig) -> None:
    """Refuse a config whose routed experts are stored packed (MXFP4 / int4 buffers, not parameters):
    they would get no gradient, and the run would export its random initial experts as trained."""
    fmt = cfg.moe.expert_format if cfg.moe is not None else "dense"
    if fmt != "dense":
        raise ValueError(
            f"the config's quantization_config stores the routed experts as {fmt} (packed, not trainable); "
            "training needs dense experts: remove quantization_config from config.json"
        )


def init_model(cfg: ModelConfig, seed: int = 0) -> CausalLM:
    """A trainable fp32 model: the random weights ``nonstop synth`` writes for ``seed`` (normal std 0.02,
    ones for norms, FLA's A_log/dt_bias), with the expert-correction biases started at zero."""
    check_trainable(cfg)
    model = random_model(cfg, torch.float32, "cpu", seed).requires_grad_(True).train()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                p.zero_()
    return model


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on matrices and embeddings (≥ 2 dims), none on norms, A_log, dt_bias;
    the expert-correction biases are left out (they move by ``ExpertBalancer`` only)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if name.endswith("e_score_correction_bias"):
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def next_token_loss(model: CausalLM, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of targets [B, T] under model(inputs [B, T]) (fp32 logits [B, T, V])."""
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def heldout_nll(model: CausalLM, heldout: np.ndarray, tokens: int | None, context: int) -> tuple[float, int]:
    """(mean held-out NLL in nats/token, tokens scored) over the first ``tokens`` ids (all if None)."""
    was_training = model.training
    model.eval()
    try:
        score = score_token_ids(model, heldout, context=context, batch_size=8, max_tokens=tokens)
        return score.mean_nll, score.tokens
    finally:
        model.train(was_training)


def clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def train(
    model: CausalLM,
    train_ids: np.ndarray,
    heldout_ids: np.ndarray | None,
    tc: TrainConfig,
    log: Callable[[str], None] = print,
) -> TrainResult:
    """Optimise ``model`` in place on ``train_ids`` for ``tc.minutes`` (or ``tc.max_steps``); returns the record."""
    torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)
    for module in model.modules():
        if isinstance(module, KDAAttention):
            module.chunk_size = tc.kda_chunk_size
    sampler = WindowSampler(train_ids, tc.seq_len, tc.batch_size, tc.seed)
    opt = torch.optim.AdamW(param_groups(model, tc.weight_decay), lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=1e-8)
    balancer = ExpertBalancer(model, tc.bias_update_rate)
    budget = tc.minutes * 60.0
    result = TrainResult()
    model.train()
    start = time.monotonic()
    warmup_end = None
    last_log = last_eval = start
    window_tokens, window_t0 = 0, start
    try:
        while True:
            now = time.monotonic()
            elapsed = now - start
            if elapsed >= budget or (tc.max_steps is not None and result.steps >= tc.max_steps):
                break
            if warmup_end is None and result.steps >= tc.warmup_steps:
                warmup_end = elapsed
            progress = 0.0 if warmup_end is None else (elapsed - warmup_end) / max(budget - warmup_end, 1e-9)
            lr = learning_rate(result.steps, progress, tc.lr, tc.min_lr, tc.warmup_steps)
            for group in opt.param_groups:
                group["lr"] = lr
            inputs, targets = sampler.next_batch()
            loss = next_token_loss(model, inputs, targets)
            if not torch.isfinite(loss):
                raise TrainingDiverged(_diverged(f"the loss became {loss.item()} at step {result.steps + 1}", lr, tc))
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip))
            opt.step()
            opt.zero_grad(set_to_none=True)
            balancer.step()
            result.steps += 1
            result.tokens += inputs.numel()
            window_tokens += inputs.numel()
            now = time.monotonic()
            result.history.append(
                {
                    "step": result.steps,
                    "tokens": result.tokens,
                    "elapsed_s": round(now - start, 2),
                    "loss": round(loss.item(), 4),
                    "lr": lr,
                    "grad_norm": round(grad_norm, 4),
                }
            )
            if now - last_log >= tc.log_every_s or result.steps == 1:
                speed = window_tokens / max(now - window_t0, 1e-9)
                recent = np.mean([h["loss"] for h in result.history[-20:]])
                log(
                    f"step {result.steps:5d} | tokens {result.tokens:>10,} | loss {recent:.3f} | lr {lr:.2e} | "
                    f"{speed:,.0f} tok/s | elapsed {clock(now - start)} | ETA {clock(budget - (now - start))} | load "
                    f"{os.getloadavg()[0]:.1f}"
                )
                last_log, window_tokens, window_t0 = now, 0, now
            if heldout_ids is not None and now - last_eval >= tc.eval_every_s:
                nll, scored = heldout_nll(model, heldout_ids, tc.eval_tokens, tc.seq_len)
                result.evals.append(
                    {
                        "step": result.steps,
                        "tokens": result.tokens,
                        "elapsed_s": round(now - start, 1),
                        "heldout_nll": round(nll, 4),
                        "heldout_ppl": round(math.exp(nll), 2),
                        "load_avg_1m": round(os.getloadavg()[0], 2),
                    }
                )
                spread = max(balancer.recent_spreads().values(), default=1.0)
                log(
                    f"eval  step {result.steps} | held-out ({scored} tokens) nll {nll:.3f} ppl "
                    f"{math.exp(nll):.1f} | expert load max/mean {spread:.2f}"
                )
                last_eval = time.monotonic()
                window_t0 += last_eval - now  # evaluation time is not training speed
    except (MemoryError, RuntimeError) as exc:
        if not allocation_failed(exc):
            raise
        raise TrainingOutOfMemory(
            f"out of memory in training step {result.steps + 1} ({tc.batch_size} sequences x {tc.seq_len} tokens): "
            f"lower --batch-size (now {tc.batch_size}) or --seq-len (now {tc.seq_len})"
        ) from None
    finally:
        balancer.remove()
    result.wall_s = time.monotonic() - start
    result.epochs = sampler.epochs_done
    result.expert_load_spread = {k: round(v, 3) for k, v in balancer.spreads().items()}
    result.expert_load_spread_end = {k: round(v, 3) for k, v in balancer.recent_spreads().items()}
    model.eval()
    if result.steps:
        _check_last_update(model, inputs, targets, result.steps, lr, tc)
    return result


def _diverged(what: str, lr: float, tc: TrainConfig) -> str:
    return (
        f"training diverged: {what} (learning rate {lr:.3g}); lower --lr (now {tc.lr:g}) or lengthen "
        f"--warmup-steps (now {tc.warmup_steps})"
    )


def _check_last_update(
    model, inputs: torch.Tensor, targets: torch.Tensor, steps: int, lr: float, tc: TrainConfig
) -> None:
    """``TrainingDiverged`` when the last update (step ``steps``, at learning rate ``lr``) left a weight that is
    not finite, or weights whose loss on that step's batch (``inputs`` / ``targets`` [batch, seq]) is not:
    each step checks its loss before its update, so the last update is checked here, before anything is
    saved."""
    bad = next((name for name, p in model.named_parameters() if not torch.isfinite(p).all()), None)
    if bad is not None:
        raise TrainingDiverged(_diverged(f"the update of step {steps} left {bad} not finite", lr, tc))
    with torch.no_grad():
        loss = next_token_loss(model, inputs, targets)
    if not torch.isfinite(loss):
        raise TrainingDiverged(_diverged(f"the loss became {loss.item()} after the update of step {steps}", lr, tc))
