"""``nonstop perplexity``: score a text file with a model (token count, mean NLL, perplexity)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from nonstop.commands.common import add_model_args, positive_int

DEFAULT_CONTEXT = 512  # tokens per window when --context is not given (fewer where the model has fewer positions)
LONG_TEXT_CHARS = 1_000_000  # tokenizing more characters than this is announced on stderr (seconds of work)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "perplexity",
        help="perplexity of a text file under a model",
        description="Tokenize FILE with the model's tokenizer and score it in windows of --context tokens "
        "(whole-window forwards in plain torch, "
        "no cache; consecutive windows share one token so every token after the first is predicted once). Prints the "
        "token "
        "count, the mean negative log-likelihood in nats and a last line 'perplexity: X'. With --max-tokens only as "
        "much of the file is tokenized as those tokens need.",
    )
    p.add_argument("file", help="UTF-8 text file to score (a leading byte-order mark is not scored)")
    add_model_args(p, backend=False, text=True)
    p.add_argument(
        "--max-tokens", type=positive_int, default=None, help="score at most this many tokens (default: the whole file)"
    )
    p.add_argument(
        "--context",
        type=positive_int,
        default=None,
        help=f"tokens per scoring window (default {DEFAULT_CONTEXT}, or the model's positions where it has fewer)",
    )
    p.add_argument("--batch-size", type=positive_int, default=4, help="windows per forward (default 4)")
    p.set_defaults(run=run)


def scoring_context(given: int | None, positions: int) -> int:
    """The window: --context as given (a ValueError past the model's ``positions``), else ``DEFAULT_CONTEXT``
    or ``positions`` where that is fewer."""
    if given is None:
        return min(DEFAULT_CONTEXT, positions)
    if given > positions:
        raise ValueError(f"--context {given} exceeds the model's {positions} positions (max_position_embeddings)")
    return given


def run(args) -> int:
    import torch

    from nonstop.commands.common import llm_from_args
    from nonstop.engine.perplexity import leading_token_ids, score_token_ids
    from nonstop.engine.tokenizer import TOKENIZER_FILES
    from nonstop.threads import configure_threads

    path = Path(args.file)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file" if not path.exists() else f"{path}: not a regular file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM marks the encoding; it is not text to score
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    context = None

    def before_load(llm) -> None:  # config and tokenizer known, weights not loaded yet: refuse early
        nonlocal context
        if not llm.tokenizer.accepts_text:
            raise ValueError(
                f"{llm.model_dir} has no tokenizer ({' or '.join(TOKENIZER_FILES)}): perplexity scores text; give "
                "--tokenizer bytes to score its UTF-8 bytes as token ids, or add the tokenizer files to the checkpoint"
            )
        context = scoring_context(args.context, llm.cfg.max_position_embeddings)

    # Scoring calls llm.model directly (plain torch, no cache) and samples nothing: the reference backend builds
    # no kernels, and the checkpoint's sampling defaults (generation_config.json) are not read.
    llm = llm_from_args(args, max_batch=1, backend="reference", generation_config=False, before_load=before_load)
    configure_threads(args.threads, announce=True)  # a thread per physical core less those other processes keep busy

    def announce(chars: int, total: int) -> None:
        if chars >= LONG_TEXT_CHARS:
            print(f"  tokenizing {chars:,} of {total:,} characters", file=sys.stderr, flush=True)

    wanted = None if args.max_tokens is None else args.max_tokens + 1  # the first id is context only
    ids, whole = leading_token_ids(llm.tokenizer.encode, text, wanted, announce)
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
            context=context,
            batch_size=args.batch_size,
            max_tokens=args.max_tokens,
            device=llm.device,
            progress=progress,
        )
    seconds = time.perf_counter() - t0
    print(f"model: {llm.name}")
    read = result.tokens + 1  # the first id is context only: every later one is scored
    if whole:
        cut = f", the first {read} read (--max-tokens)" if read < len(ids) else ""
        print(f"file: {path} ({len(ids)} tokens{cut})")
    else:  # the rest of the file was never tokenized
        print(f"file: {path} (its first {read} tokens read (--max-tokens))")
    print(f"tokens scored: {result.tokens}")
    print(f"mean NLL: {result.mean_nll:.4f} nats/token")
    print(f"perplexity: {result.perplexity:.3f}", flush=True)
    print(f"[{llm.name} | context {context} | {result.tokens / max(seconds, 1e-9):.0f} tokens/s]", file=sys.stderr)
    return 0
