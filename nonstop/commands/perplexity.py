"""``nonstop perplexity``: score a text file with a model (token count, mean NLL, perplexity)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from nonstop.commands.common import add_model_args, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser(
        "perplexity",
        help="perplexity of a text file under a model",
        description="Tokenize FILE with the model's tokenizer and score it in windows of --context tokens "
        "(whole-window forwards, "
        "no cache; consecutive windows share one token so every token after the first is predicted once). Prints the "
        "token "
        "count, the mean negative log-likelihood in nats and a last line 'perplexity: X'.",
    )
    p.add_argument("file", help="UTF-8 text file to score (a leading byte-order mark is not scored)")
    add_model_args(p, backend=False, text=True)
    p.add_argument(
        "--max-tokens", type=positive_int, default=None, help="score at most this many tokens (default: the whole file)"
    )
    p.add_argument("--context", type=positive_int, default=512, help="tokens per scoring window (default 512)")
    p.add_argument("--batch-size", type=positive_int, default=4, help="windows per forward (default 4)")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    from nonstop.commands.common import llm_from_args
    from nonstop.engine.perplexity import score_token_ids
    from nonstop.weights.resolve import resolve_model

    path = Path(args.file)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file" if not path.exists() else f"{path}: not a regular file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM marks the encoding; it is not text to score
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    cfg, _ = resolve_model(args.model)
    if args.context > cfg.max_position_embeddings:
        raise ValueError(
            f"--context {args.context} exceeds the model's {cfg.max_position_embeddings} positions "
            "(max_position_embeddings)"
        )
    llm = llm_from_args(args, max_batch=1)
    ids = llm.tokenizer.encode(text)
    t0 = time.perf_counter()
    tty = sys.stderr.isatty()
    shown = [t0, 0]  # when and at how many tokens the last progress line was printed

    def progress(done: int, total: int) -> None:  # a line a second on a terminal, else one per tenth of the file
        now = time.perf_counter()
        due = now - shown[0] >= 1 if tty else done - shown[1] >= total / 10
        if done == total or due:
            rate = done / max(now - t0, 1e-9)
            end = "\n" if done == total or not tty else ""
            print(
                f"\r  scored {done:,} / {total:,} tokens ({rate:,.0f} tokens/s)", end=end, file=sys.stderr, flush=True
            )
            shown[:] = [now, done]

    with torch.inference_mode():
        result = score_token_ids(
            llm.model,
            ids,
            context=args.context,
            batch_size=args.batch_size,
            max_tokens=args.max_tokens,
            device=llm.device,
            progress=progress,
        )
    seconds = time.perf_counter() - t0
    print(f"model: {llm.name}")
    read = result.tokens + 1  # the first id is context only: every later one is scored
    cut = f", the first {read} read (--max-tokens)" if read < len(ids) else ""
    print(f"file: {path} ({len(ids)} tokens{cut})")
    print(f"tokens scored: {result.tokens}")
    print(f"mean NLL: {result.mean_nll:.4f} nats/token")
    print(f"perplexity: {result.perplexity:.3f}", flush=True)
    print(f"[{llm.name} | context {args.context} | {result.tokens / max(seconds, 1e-9):.0f} tokens/s]", file=sys.stderr)
    return 0
