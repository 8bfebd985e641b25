"""``nonstop train``: train a small K3-architecture model on the offline corpus for a time budget."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from nonstop.commands.common import (
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    seed_int,
    thread_count,
)

MAX_MINUTES = 60 * 24 * 366  # a year: a longer budget is a typo (1e307 overflowed the clock arithmetic)
MAX_COUNT = 10**9  # steps or sequences: more is a typo (huge ones overflowed float arithmetic or numpy)
MAX_BIAS_RATE = 1.0  # a bias step as large as the router's scores, in [0, 1] (huge ones made the biases infinite)


def _at_most(parse, limit: int, what: str):
    """An argparse type: ``parse(text)``, refused above ``limit`` (``what`` names the limit in the message)."""

    def check(text: str):
        value = parse(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"expected at most {what}, got {text}")
        return value

    return check


minutes_float = _at_most(positive_float, MAX_MINUTES, f"{MAX_MINUTES:,} minutes (a year)")
count_int = _at_most(positive_int, MAX_COUNT, f"{MAX_COUNT:,}")
steps_int = _at_most(non_negative_int, MAX_COUNT, f"{MAX_COUNT:,}")
bias_rate_float = _at_most(non_negative_float, MAX_BIAS_RATE, f"{MAX_BIAS_RATE:g} (the scale of the router's scores)")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a small model (k3-nano) from scratch on the offline corpus",
        description="Train a K3-architecture model from random weights on build/corpus (python -m "
        "nonstop.train.corpus) with the "
        "build/tokenizer BPE tokenizer (python -m nonstop.train.tokenizer), for a wall-clock budget: AdamW with "
        "warmup and cosine "
        "decay over the budget, packed sequences, gradient clipping, aux-loss-free expert balancing, periodic "
        "progress and "
        "held-out evaluation. Writes an HF checkpoint (config.json, model.safetensors, tokenizer, "
        "generation_config.json), "
        "training_log.json and loss_curve.png to --out.",
    )
    p.add_argument(
        "--corpus",
        default="build/corpus",
        help="corpus directory with train.txt and heldout.txt (default build/corpus)",
    )
    p.add_argument(
        "--tokenizer", default="build/tokenizer", help="directory with tokenizer.json (default build/tokenizer)"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", default="k3-nano", help="model preset to train (default k3-nano)")
    src.add_argument("--config", help="an HF config.json (or a directory holding one) instead of a preset")
    p.add_argument(
        "--out",
        required=True,
        help="output directory for the checkpoint and logs (made if missing; a checkpoint already there is replaced "
        "once the new one is written)",
    )
    p.add_argument(
        "--minutes",
        type=minutes_float,
        default=40.0,
        help="wall-clock budget of the training loop in minutes (default 40; final evaluation and saving take ~1-2 "
        "more)",
    )
    p.add_argument("--threads", type=thread_count, default=2, help="CPU threads (default 2)")
    p.add_argument("--batch-size", type=count_int, default=8, help="sequences per step (default 8)")
    p.add_argument("--seq-len", type=count_int, default=256, help="tokens per sequence (default 256)")
    p.add_argument("--lr", type=positive_float, default=2e-3, help="peak learning rate (default 2e-3)")
    p.add_argument(
        "--min-lr", type=non_negative_float, default=2e-4, help="learning rate at the end of the budget (default 2e-4)"
    )
    p.add_argument(
        "--warmup-steps", type=steps_int, default=30, help="linear warmup steps (default 30; 0: start at the peak)"
    )
    p.add_argument(
        "--weight-decay", type=non_negative_float, default=0.1, help="AdamW weight decay on matrices (default 0.1)"
    )
    p.add_argument(
        "--bias-update-rate",
        type=bias_rate_float,
        default=1e-2,
        help="step of the aux-loss-free expert-bias update, b_e += rate * sign(mean load - load_e) (default 1e-2)",
    )
    p.add_argument("--max-steps", type=count_int, default=None, help="stop after this many steps even if time is left")
    p.add_argument(
        "--eval-every",
        type=non_negative_float,
        default=300.0,
        help="seconds between held-out evaluations (default 300)",
    )
    p.add_argument(
        "--log-every", type=non_negative_float, default=30.0, help="seconds between progress lines (default 30)"
    )
    p.add_argument(
        "--seed", type=seed_int, default=0, help="seed of the initial weights and the data order (default 0)"
    )
    p.add_argument(
        "--cache-dir", default="build/tokens", help="where the tokenized corpus is cached (default build/tokens)"
    )
    p.add_argument("--no-samples", action="store_true", help="skip the greedy sample generations at the end")
    p.set_defaults(run=run)


def run(args) -> int:
    from nonstop.commands.synth import note_kept_files
    from nonstop.config import ModelConfig
    from nonstop.train.run import run_training
    from nonstop.train.trainer import TrainConfig
    from nonstop.weights.write import check_output_dir

    outputs = (("--out", args.out, "the checkpoint"), ("--cache-dir", args.cache_dir, "the token cache"))
    for flag, path, what in outputs:  # before the tokenizing and training
        check_output_dir(path, flag, what)
    if args.min_lr > args.lr:
        raise ValueError(f"--min-lr {args.min_lr:g} is above the peak --lr {args.lr:g}")
    cfg = ModelConfig.from_file(args.config) if args.config else ModelConfig.preset(args.preset)
    tc = TrainConfig(
        minutes=args.minutes,
        threads=args.threads,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        min_lr=args.min_lr,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        bias_update_rate=args.bias_update_rate,
        eval_every_s=args.eval_every,
        log_every_s=args.log_every,
        seed=args.seed,
        max_steps=args.max_steps,
    )
    t0 = time.monotonic()

    def log(message: str) -> None:
        print(f"[train {(time.monotonic() - t0) / 60:5.1f}m] {message}", file=sys.stderr, flush=True)

    run_training(
        Path(args.corpus),
        Path(args.tokenizer),
        cfg,
        tc,
        Path(args.out),
        Path(args.cache_dir),
        log,
        samples=not args.no_samples,
    )
    note_kept_files(Path(args.out), "train")
    return 0
