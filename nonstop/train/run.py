"""One training run end to end: tokens -> trained model -> HF checkpoint, log, loss curve, samples.

``run_training`` writes into ``out_dir``:
  config.json, model.safetensors, generation_config.json, tokenizer files   (the checkpoint)
  training_log.json   settings, steps, tokens, wall time, threads, loss history, evaluations,
                      expert load spread, final held-out perplexity, greedy samples
  loss_curve.png      train / held-out loss against tokens seen
The final held-out perplexity is measured on the written checkpoint (bf16 weights, as users load it)
over the whole held-out split with ``nonstop.engine.perplexity``, in windows of ``FINAL_CONTEXT`` tokens
(the model's positions where it has fewer). The checkpoint and training_log.json are written before the
greedy samples are generated (the log is written again with them), so a failing sample loses no run.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from nonstop.config import ModelConfig
from nonstop.engine.perplexity import score_token_ids
from nonstop.hostinfo import cpu_name
from nonstop.program.footprint import model_footprint
from nonstop.program.preflight import PreflightError, available_memory, size_text
from nonstop.train.export import save_checkpoint
from nonstop.train.plot import plot_loss_curve
from nonstop.train.tokens import DEFAULT_CACHE_DIR, cached_token_ids
from nonstop.train.trainer import TrainConfig, check_trainable, init_model, train
from nonstop.weights.write import write_atomically

SAMPLE_PROMPTS = ("The", "The Python interpreter", "A list is", "To open a file,", "This module provides")
FINAL_CONTEXT = 512  # window of the final held-out score (the model's max_position_embeddings if fewer)


def greedy_samples(model_dir: Path, prompts=SAMPLE_PROMPTS, max_tokens: int = 48) -> list[dict]:
    """Greedy completions of ``prompts`` by the checkpoint in ``model_dir``."""
    from nonstop.engine.llm import LLM
    from nonstop.engine.sampling import SamplingParams

    llm = LLM(str(model_dir))
    outs = llm.generate(list(prompts), sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return [{"prompt": p, "completion": o.text} for p, o in zip(prompts, outs)]


def run_training(
    corpus_dir: Path,
    tokenizer_dir: Path,
    cfg: ModelConfig,
    tc: TrainConfig,
    out_dir: Path,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    log: Callable[[str], None] = print,
    samples: bool = True,
) -> dict:
    """Train ``cfg`` from scratch on ``corpus_dir`` and write everything to ``out_dir``; returns the log dict."""
    from nonstop.model.build import load_model

    wall0 = time.monotonic()
    corpus_dir, tokenizer_dir, out_dir = Path(corpus_dir), Path(tokenizer_dir), Path(out_dir)
    check_trainable(cfg)
    if tc.seq_len > cfg.max_position_embeddings:
        raise ValueError(
            f"--seq-len {tc.seq_len} exceeds the model's {cfg.max_position_embeddings} positions "
            "(max_position_embeddings)"
        )
    fp = model_footprint(cfg, torch.bfloat16)
    _check_training_memory(cfg, fp.total_params, tc)  # before the tokenizing, which can take minutes
    # the small held-out split first: a missing or empty one is refused before the training split's minutes
    heldout_ids = cached_token_ids(corpus_dir / "heldout.txt", tokenizer_dir, cache_dir, log)
    if len(heldout_ids) < 2:
        raise ValueError(f"{corpus_dir / 'heldout.txt'} holds {len(heldout_ids)} token(s): nothing to evaluate on")
    train_ids = cached_token_ids(corpus_dir / "train.txt", tokenizer_dir, cache_dir, log)
    top = int(max(train_ids.max(initial=0), heldout_ids.max()))
    if top >= cfg.vocab_size:
        raise ValueError(f"tokenizer id {top} does not fit the model's vocabulary of {cfg.vocab_size}")
    log(
        f"model: {cfg.family}, {fp.total_params / 1e6:.2f}M parameters ({fp.active_params / 1e6:.2f}M active + "
        f"{fp.embedding_params / 1e6:.2f}M embedding), {fp.weight_bytes / 1e6:.1f} MB in bf16"
    )
    log(
        f"data: {len(train_ids):,} training tokens, {len(heldout_ids):,} held-out tokens; batch {tc.batch_size} x "
        f"{tc.seq_len}; {tc.threads} threads; budget {tc.minutes:g} min"
    )
    model = init_model(cfg, tc.seed)
    result = train(model, train_ids, heldout_ids, tc, log)
    log(
        f"trained: {result.steps} steps, {result.tokens:,} tokens ({result.epochs:.2f} epochs) in "
        f"{result.wall_s / 60:.1f} min, {result.tokens / max(result.wall_s, 1e-9):,.0f} tokens/s"
    )
    if result.steps == 0:
        raise ValueError(
            f"no training step finished within --minutes {tc.minutes:g} (a step of {tc.batch_size} x {tc.seq_len} "
            "tokens takes longer): give more minutes; nothing was written"
        )
    save_checkpoint(model, out_dir, tokenizer_dir)
    del model
    saved = load_model(cfg, out_dir, torch.float32)
    context = min(FINAL_CONTEXT, cfg.max_position_embeddings)
    final = score_token_ids(saved, heldout_ids, context=context, batch_size=8)
    log(
        f"held-out ({final.tokens:,} tokens, context {context}, bf16 checkpoint): mean NLL "
        f"{final.mean_nll:.4f}, perplexity {final.perplexity:.2f}"
    )
    record = {
        "model_config": cfg.to_hf_dict(),
        "parameters": {
            "total": fp.total_params,
            "active": fp.active_params,
            "embedding": fp.embedding_params,
            "bf16_bytes": fp.weight_bytes,
        },
        "train_config": asdict(tc),
        "data": {
            "corpus": str(corpus_dir),
            "tokenizer": str(tokenizer_dir),
            "train_tokens": int(len(train_ids)),
            "heldout_tokens": int(len(heldout_ids)),
        },
        "machine": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu_count": _cpu_count(),
            "platform": platform.platform(),
            "processor": cpu_name(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "sched_autogroup": _autogroup(),
        },
        "result": {
            "steps": result.steps,
            "tokens_seen": result.tokens,
            "epochs": round(result.epochs, 3),
            "train_wall_s": round(result.wall_s, 1),
            "tokens_per_s": round(result.tokens / max(result.wall_s, 1e-9), 1),
            "final_train_loss_mean_last_50": round(
                sum(h["loss"] for h in result.history[-50:]) / len(result.history[-50:]), 4
            ),
            "heldout_tokens_scored": final.tokens,
            "heldout_context": context,
            "heldout_mean_nll": round(final.mean_nll, 4),
            "heldout_perplexity": round(final.perplexity, 3),
            "expert_load_spread_whole_run": result.expert_load_spread,
            "expert_load_spread_end": result.expert_load_spread_end,
        },
        "evals": result.evals,
        "history": result.history,
    }
    png = plot_loss_curve(
        result.history,
        result.evals,
        out_dir / "loss_curve.png",
        title=f"{cfg.family}, {fp.total_params / 1e6:.2f}M parameters: {result.tokens / 1e6:.2f}M tokens in "
        f"{result.wall_s / 60:.0f} min on {tc.threads} threads",
        eval_tokens=min(tc.eval_tokens, len(heldout_ids) - 1),  # the periodic evaluations score at most the split
        final=(result.tokens, final.mean_nll, f"final held-out (all {final.tokens:,} tokens, context {context})"),
    )
    log(f"loss curve: {png}" if png else "loss curve: skipped (matplotlib not installed)")
    _write_log(out_dir, record, wall0)  # before the samples: a sample that fails or hangs loses no run
    if samples:
        record["samples"] = greedy_samples(out_dir)
        for s in record["samples"]:
            log(f"sample: {s['prompt']!r} -> {s['completion']!r}")
        _write_log(out_dir, record, wall0)
    log(f"wrote {out_dir} (total wall time {record['result']['total_wall_s'] / 60:.1f} min)")
    return record


def _write_log(out_dir: Path, record: dict, wall0: float) -> None:
    """``record`` as out_dir/training_log.json, with the wall time since ``wall0`` as total_wall_s (written
    to a temporary file first, so a rewrite never leaves half a log)."""
    record["result"]["total_wall_s"] = round(time.monotonic() - wall0, 1)
    write_atomically(out_dir / "training_log.json", lambda f: f.write((json.dumps(record, indent=1) + "\n").encode()))


TRAIN_BYTES_PER_PARAM = 16  # fp32 weight, its gradient and AdamW's two moments (activations come on top)
LOGIT_COPIES = 3  # a step's fp32 logits, the log-softmax cross-entropy keeps for backward, and their gradient


def _check_training_memory(cfg: ModelConfig, params: int, tc: TrainConfig) -> None:
    """PreflightError before any weight is built when this machine cannot hold even the optimiser's
    per-parameter state and one step's logits (a lower bound of what training needs)."""
    state = TRAIN_BYTES_PER_PARAM * params
    logits = LOGIT_COPIES * 4 * tc.batch_size * tc.seq_len * cfg.vocab_size
    free = available_memory(torch.device("cpu"))
    if state > free:
        raise PreflightError(
            f"training {cfg.family} ({params / 1e6:,.1f}M parameters) needs at least {size_text(state)} "
            f"(fp32 weights, gradients and AdamW moments, {TRAIN_BYTES_PER_PARAM} B a parameter, before "
            f"activations); this machine has {size_text(free)} free"
        )
    if state + logits > free:
        raise PreflightError(
            f"a training step of --batch-size {tc.batch_size} x --seq-len {tc.seq_len} needs at least "
            f"{size_text(logits)} for its logits alone ({LOGIT_COPIES} fp32 copies of {cfg.vocab_size:,} per token) "
            f"beside {size_text(state)} of weights and optimiser state; this machine has {size_text(free)} free: "
            "lower --batch-size or --seq-len"
        )


def _autogroup() -> str | None:
    """The scheduler group of this process and its nice value (Linux autogroup), e.g. '/autogroup-7 nice 0'."""
    try:
        return Path("/proc/self/autogroup").read_text().strip()
    except OSError:
        return None


def _cpu_count() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()
