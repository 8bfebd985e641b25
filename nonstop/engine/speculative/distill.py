"""Train a DSpark drafter for a target model by distillation on the target's own outputs.

    python -m nonstop.engine.speculative.distill --model nonstop/assets/k3-nano --minutes 20

1. Prompts: random windows of the training token stream (``build/tokens/train-*.npy``, else
   ``build/corpus/train.txt`` through the model's tokenizer); held-out prompts likewise from the
   held-out split.
2. Continuations: the target generates from each prompt (greedy, and a share sampled at T = 0.8).
3. Teacher pass: one cache-free forward over prompt + continuation gives, at every position j, the
   tapped residual streams (the drafter's context features) and the target's next-token
   distribution: its argmax and top-8 probabilities.
4. Training: an anchor position p; context = features of the ``context_window`` positions before p;
   slot i (0..k-1) learns the target's prediction at p+i with the true token x_{p+i} fed to the Markov
   head (teacher forcing, which is exactly the situation of an accepted prefix):
       loss = mean_i [ CE(logits_i, argmax_i) + Σ_top8 p_i log(1 / q_i) ]
   AdamW, warm-up then cosine decay over the time budget; progress every ``--log-every`` seconds.
5. Evaluation on held-out continuations: greedy drafting with the Markov head fed the drafts;
   per-slot conditional acceptance and the mean accepted length τ = E[1 + accepted] per block size.
6. Saves ``config.json`` (with the training report) + ``model.safetensors`` (bf16).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from nonstop.cache.state import ModelCache
from nonstop.engine.speculative.dspark import DSparkConfig, DSparkModel, save_drafter

SOFT_TOP = 8


def log(msg: str) -> None:
    print(f"[distill {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- data


def token_stream(split: str, tokenizer, vocab: int, root: Path) -> np.ndarray:
    """The ``split`` (train | heldout) token ids: the cached stream if it fits the vocabulary, else the corpus
    text tokenized."""
    for path in sorted((root / "build" / "tokens").glob(f"{split}-*.npy")):
        ids = np.load(path, mmap_mode="r")
        if int(ids.max()) < vocab:
            return ids
    text_path = root / "build" / "corpus" / f"{split}.txt"
    if not text_path.is_file():
        raise FileNotFoundError(
            f"no {split} token stream under {root / 'build'}: build the corpus with `python -m nonstop.train.corpus` "
            "or point --root at the directory holding build/"
        )
    text = text_path.read_text()
    return np.asarray(tokenizer.encode(text[:4_000_000], add_special_tokens=False), dtype=np.int64)


def sample_prompts(stream: np.ndarray, n: int, length: int, rng: np.random.Generator) -> torch.Tensor:
    """n windows stream[s : s + length] -> [n, length] int64, s uniform over every start that fits."""
    starts = rng.integers(0, len(stream) - length + 1, n)
    return torch.tensor(np.stack([np.asarray(stream[s : s + length], dtype=np.int64) for s in starts]))


@torch.inference_mode()
def generate(model, prompts: torch.Tensor, new_tokens: int, temperature: float, gen: torch.Generator) -> torch.Tensor:
    """prompts [B, P] -> [B, P + new_tokens]: batched decode with the target (greedy at temperature 0)."""
    B, P = prompts.shape
    cache = ModelCache(model.cfg, B, capacity=P + new_tokens)
    batch = cache.batch(list(range(B)), P)
    logits = model(prompts, cache, batch, last_only=True)
    cache.advance(batch)
    out = [prompts]
    for step in range(new_tokens):
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)[:, 0]
        out.append(nxt[:, None])
        if step + 1 < new_tokens:
            batch = cache.batch(list(range(B)), 1)
            logits = model(nxt[:, None], cache, batch, last_only=True)
            cache.advance(batch)
    return torch.cat(out, dim=1)


@torch.inference_mode()
def teacher(model, seqs: torch.Tensor, taps: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """Cache-free target pass over seqs [B, L]: features [B, L, m·d] (fp16), argmax [B, L],
    top-8 ids [B, L, 8] and their probabilities [B, L, 8] (renormalised)."""
    from nonstop.cache.state import StepBatch

    B, L = seqs.shape
    zeros = torch.zeros(B, dtype=torch.long)
    hidden, captured = model.body(seqs, StepBatch(torch.arange(B), zeros, L), None, capture=taps)
    logits = model.logits(hidden)
    top = torch.softmax(logits, -1).topk(SOFT_TOP, dim=-1)
    return {
        "features": torch.cat([captured[t] for t in taps], dim=-1).half(),
        "argmax": logits.argmax(-1),
        "top_ids": top.indices,
        "top_probs": top.values / top.values.sum(-1, keepdim=True),
        "seqs": seqs,
    }


def build_set(
    model,
    stream,
    n: int,
    prompt_len: int,
    new_tokens: int,
    sampled_share: float,
    taps,
    rng,
    gen,
    batch: int,
    deadline: float,
) -> dict[str, torch.Tensor]:
    """Generate and teacher-label up to n sequences (n >= 1), stopping early at ``deadline`` - but never before
    the first batch: a set must hold something to train or evaluate on (a budget spent loading the model, or
    spent on the held-out set, still leaves one batch of training sequences)."""
    parts: list[dict] = []
    done = 0
    while done < n and (not parts or time.perf_counter() < deadline):
        b = min(batch, n - done)
        temperature = 0.8 if rng.random() < sampled_share else 0.0
        seqs = generate(model, sample_prompts(stream, b, prompt_len, rng), new_tokens, temperature, gen)
        parts.append(teacher(model, seqs, taps))
        done += b
        log(f"  {done}/{n} sequences ({'sampled' if temperature else 'greedy'} batch)")
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


# ----------------------------------------------------------------------------- training


def make_batch(data: dict, idx: torch.Tensor, anchors: torch.Tensor, cfg: DSparkConfig) -> dict[str, torch.Tensor]:
    """Examples (sequence idx [N], anchor position p [N]): context windows, anchor, Markov inputs, labels."""
    W, k = cfg.context_window, cfg.block_size
    offs = torch.arange(-W, 0)
    ctx_pos = anchors[:, None] + offs  # [N, W]
    valid = ctx_pos >= 0
    ctx_pos_c = ctx_pos.clamp_min(0)
    slots = anchors[:, None] + torch.arange(k)  # positions p..p+k-1: slot i predicts p+i+1
    return {
        "features": data["features"][idx[:, None], ctx_pos_c].float(),
        "valid": valid,
        "ctx_pos": ctx_pos_c,
        "anchor_ids": data["seqs"][idx, anchors],
        "anchor_pos": anchors,
        "prev_ids": data["seqs"][idx[:, None], slots],
        "labels": data["argmax"][idx[:, None], slots],
        "top_ids": data["top_ids"][idx[:, None], slots],
        "top_probs": data["top_probs"][idx[:, None], slots],
    }


def sample_examples(
    data: dict, n: int, min_anchor: int, cfg: DSparkConfig, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    N, L = data["seqs"].shape
    idx = torch.randint(0, N, (n,), generator=gen)
    anchors = torch.randint(min_anchor, L - cfg.block_size + 1, (n,), generator=gen)
    return idx, anchors


def loss_fn(
    drafter: DSparkModel, b: dict, embed: torch.Tensor, head: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hard + soft distillation loss, and per-slot top-1 agreement with the target [k]."""
    logits = drafter(
        b["features"], b["valid"], b["ctx_pos"], b["anchor_ids"], b["anchor_pos"], b["prev_ids"], embed, head
    )
    logp = torch.log_softmax(logits, -1)
    hard = F.nll_loss(logp.flatten(0, 1), b["labels"].flatten())
    soft = -(b["top_probs"] * logp.gather(-1, b["top_ids"])).sum(-1).mean()
    agree = (logits.argmax(-1) == b["labels"]).float().mean(0)
    return hard + soft, agree


@torch.no_grad()
def evaluate(drafter: DSparkModel, data: dict, min_anchor: int, embed, head, n: int = 512, seed: int = 0) -> dict:
    """Greedy drafting on held-out greedy continuations: slot i's draft feeds slot i+1's Markov head;
    a block's accepted length = the longest prefix equal to the target's argmax chain (+1 bonus)."""
    cfg = drafter.cfg
    gen = torch.Generator().manual_seed(seed)
    idx, anchors = sample_examples(data, n, min_anchor, cfg, gen)
    b = make_batch(data, idx, anchors, cfg)
    c = drafter.context(b["features"])
    kv = [layer.context_kv(c, b["ctx_pos"]) for layer in drafter.layers]
    hidden = drafter.block_hidden(kv, b["valid"], embed[b["anchor_ids"]], b["anchor_pos"], cfg.block_size)
    base = drafter.base_logits(hidden, head)
    prev = b["anchor_ids"]
    drafts = []
    for i in range(cfg.block_size):
        prev = (base[:, i] + drafter.markov(prev)).argmax(-1)
        drafts.append(prev)
    match = (torch.stack(drafts, 1) == b["labels"]).long()  # labels = the target's greedy chain
    accepted = match.cumprod(1)  # [n, k]: slot i accepted iff all before it were
    report = {"examples": n, "per_slot_conditional_acceptance": [], "tau_by_num_tokens": {}}
    for i in range(cfg.block_size):
        before = accepted[:, i - 1] if i else torch.ones(n, dtype=torch.long)
        alive = int(before.sum())
        report["per_slot_conditional_acceptance"].append(round(float(accepted[:, i].sum()) / max(alive, 1), 4))
        report["tau_by_num_tokens"][str(i + 1)] = round(1 + float(accepted[:, : i + 1].sum(1).float().mean()), 4)
    return report


def layer_list(text: str) -> tuple[int, ...]:
    """``--taps``: comma-separated layer indices >= 0 (argparse type)."""
    try:
        taps = tuple(int(t) for t in text.split(","))
    except ValueError:
        taps = ()
    if not taps or min(taps) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices >= 0, got {text!r}")
    return taps


def check_args(p: argparse.ArgumentParser, args) -> None:
    """Refuse sizes that cannot make a drafter, with the options named (``p.error``: usage and exit 2)."""
    for flag in ("sequences", "heldout_sequences", "prompt_len", "new_tokens", "block_size", "batch"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.block_size > args.new_tokens:  # held-out blocks start after the prompt and must end inside the text
        p.error(
            f"--block-size {args.block_size} exceeds --new-tokens {args.new_tokens}: a drafted block is checked "
            "against the generated continuation, so it can be at most that long"
        )
    if args.minutes <= 0 or not 0 < args.data_share < 1:
        p.error(f"--minutes must be > 0 and --data-share in (0, 1), got {args.minutes} and {args.data_share}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m nonstop.engine.speculative.distill",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="nonstop/assets/k3-nano", help="target checkpoint directory")
    p.add_argument("--out", default=None, help="output directory (default: MODEL/dspark)")
    p.add_argument("--root", default=".", help="repository root holding build/ (token streams, corpus)")
    p.add_argument("--minutes", type=float, default=20.0, help="total time budget (data + training + evaluation)")
    p.add_argument("--data-share", type=float, default=0.3, help="share of the budget for generating the training set")
    p.add_argument(
        "--sequences", type=int, default=768, help="training sequences to generate (fewer if the data budget runs out)"
    )
    p.add_argument("--heldout-sequences", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=48)
    p.add_argument("--new-tokens", type=int, default=80)
    p.add_argument(
        "--sampled-share", type=float, default=0.25, help="share of continuations sampled at T=0.8 (the rest greedy)"
    )
    p.add_argument(
        "--taps",
        type=layer_list,
        default=None,
        help="target layers to read, e.g. '3,6,8' (default: block boundaries + the final residual)",
    )
    p.add_argument("--block-size", type=int, default=7)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--context-window", type=int, default=64)
    p.add_argument("--markov-rank", type=int, default=32)
    p.add_argument("--batch", type=int, default=64, help="anchors per training step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=float, default=30.0, help="seconds between progress lines")
    args = p.parse_args(argv)
    check_args(p, args)

    from nonstop.config import ConfigError, ModelConfig
    from nonstop.engine.tokenizer import Tokenizer
    from nonstop.model.build import load_model
    from nonstop.weights.errors import CheckpointError

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    budget = args.minutes * 60
    model_dir = Path(args.model)
    try:
        cfg = ModelConfig.from_file(model_dir)
        target = load_model(cfg, model_dir, torch.float32)
        tokenizer = Tokenizer.load(model_dir, cfg.vocab_size)
    except (ConfigError, CheckpointError, OSError, ValueError) as exc:
        p.exit(2, f"{p.prog}: error: {args.model}: {exc}\n")
    L = cfg.num_hidden_layers
    if args.taps:
        taps = args.taps
        if max(taps) > L:
            p.error(f"--taps {','.join(map(str, taps))}: the target's layers are 0..{L}")
    elif cfg.uses_attn_res:
        taps = tuple(range(cfg.attn_res_block_size, L, cfg.attn_res_block_size)) + (L,)
    else:
        taps = (L // 2, L)
    dcfg = DSparkConfig(
        cfg.vocab_size,
        cfg.hidden_size,
        taps,
        args.block_size,
        args.layers,
        args.heads,
        args.head_dim,
        args.intermediate,
        args.context_window,
        args.markov_rank,
        cfg.rms_norm_eps,
    )
    log(
        f"target {model_dir} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}); drafter taps {taps}, block "
        f"{dcfg.block_size}"
    )

    rng = np.random.default_rng(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    root = Path(args.root)
    try:
        train_stream = token_stream("train", tokenizer, cfg.vocab_size, root)
        held_stream = token_stream("heldout", tokenizer, cfg.vocab_size, root)
    except OSError as exc:
        p.exit(2, f"{p.prog}: error: {exc}\n")
    shortest = min(len(train_stream), len(held_stream))
    if args.prompt_len > shortest:
        p.error(f"--prompt-len {args.prompt_len} is longer than the shortest token stream ({shortest} tokens)")
    log(f"token streams: train {len(train_stream)}, held-out {len(held_stream)}")
    data_deadline = t0 + args.data_share * budget
    held = build_set(
        target,
        held_stream,
        args.heldout_sequences,
        args.prompt_len,
        args.new_tokens,
        0.0,
        taps,
        rng,
        gen,
        32,
        data_deadline,
    )
    train = build_set(
        target,
        train_stream,
        args.sequences,
        args.prompt_len,
        args.new_tokens,
        args.sampled_share,
        taps,
        rng,
        gen,
        128,
        data_deadline,
    )
    log(
        f"training set: {train['seqs'].shape[0]} sequences of {train['seqs'].shape[1]} tokens "
        f"({time.perf_counter() - t0:.0f}s)"
    )

    drafter = DSparkModel(dcfg)
    embed, head = target.embed_tokens.weight.detach(), target.lm_head_weight.detach()
    with torch.no_grad():
        drafter.mask_embedding.normal_(0, float(embed.std()))
        drafter.markov_w2.weight.zero_()  # the Markov bias starts at zero and learns what the block misses
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    train_deadline = t0 + 0.95 * budget
    start = time.perf_counter()
    span = max(train_deadline - start, 1.0)
    min_anchor = max(1, args.prompt_len // 2)
    step, last_log, history = 0, start, []
    agree_avg = None
    while time.perf_counter() < train_deadline:
        frac = (time.perf_counter() - start) / span
        lr = args.lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        for group in opt.param_groups:
            group["lr"] = lr
        b = make_batch(train, *sample_examples(train, args.batch, min_anchor, dcfg, gen), dcfg)
        loss, agree = loss_fn(drafter, b, embed, head)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        agree_avg = agree if agree_avg is None else 0.95 * agree_avg + 0.05 * agree
        if time.perf_counter() - last_log > args.log_every:
            last_log = time.perf_counter()
            agreement = [round(float(a), 2) for a in agree_avg]
            line = f"step {step} loss {loss.item():.3f} lr {lr:.2e} slot agreement {agreement} ({last_log - t0:.0f}s)"
            history.append(line)
            log(line)
    drafter.eval()
    report = evaluate(drafter, held, args.prompt_len, embed, head)
    report.update(
        steps=step,
        train_sequences=int(train["seqs"].shape[0]),
        heldout_sequences=int(held["seqs"].shape[0]),
        minutes=round((time.perf_counter() - t0) / 60, 1),
        threads=args.threads,
    )
    log(f"held-out greedy acceptance: {json.dumps(report)}")
    out = Path(args.out) if args.out else model_dir / "dspark"
    save_drafter(drafter, out, extra_config={"target": str(model_dir.name), "training": report})
    log(f"saved {out} ({sum(p.numel() for p in drafter.parameters()) / 1e6:.2f}M parameters, bf16)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
