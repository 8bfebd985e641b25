"""``nonstop perplexity``: score a text file with a model (token count, mean NLL, perplexity)."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from nonstop.commands.common import add_model_args, positive_int
from nonstop.program.preflight import size_text

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
        "much of the file is read and tokenized as those tokens need.",
    )
    p.add_argument(
        "file", help="UTF-8 text file to score as written (line ends too; a leading byte-order mark is not scored)"
    )
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
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=4,
        help="windows per forward (default 4); a forward holds two fp32 copies of its logits, batch x context x "
        "vocabulary each, checked against the free memory before scoring",
    )
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
    from nonstop.commands.common import llm_from_args
    from nonstop.engine.perplexity import leading_token_ids
    from nonstop.threads import configure_threads

    if not args.file:
        raise ValueError("the text file to score is an empty path: give a file name")
    path = Path(args.file)
    text = read_text(path) if args.max_tokens is None else FilePrefixes(path)  # a prefix is all --max-tokens reads
    context = ids = whole = None

    def announce(chars: int, total: int | None) -> None:
        if chars >= LONG_TEXT_CHARS:
            what = f"{chars:,} of {total:,} characters" if total is not None else f"the first {chars:,} characters"
            size = "" if total is not None else f" (a file of {size_text(text.size)})"
            print(f"  tokenizing {what}{size}", file=sys.stderr, flush=True)

    def before_load(llm) -> None:  # config and tokenizer known, weights not loaded yet: refuse early
        nonlocal context, ids, whole
        if not llm.tokenizer.accepts_text:
            raise ValueError(no_tokenizer_message(llm.model_dir, llm.cfg.vocab_size))
        context = scoring_context(args.context, llm.cfg.max_position_embeddings)
        wanted = None if args.max_tokens is None else args.max_tokens + 1  # the first id is context only
        ids, whole = leading_token_ids(llm.tokenizer.encode, text, wanted, announce)
        if len(ids) < 2:
            raise ValueError(
                f"{path}: {len(ids)} token(s) under this tokenizer; perplexity needs at least 2 (the first is "
                "context only)"
            )

    # Scoring calls llm.model directly (plain torch, no cache) and samples nothing: the reference backend builds
    # no kernels, and the checkpoint's sampling defaults (generation_config.json) are not read.
    llm = llm_from_args(args, max_batch=1, backend="reference", generation_config=False, before_load=before_load)
    configure_threads(args.threads, announce=True)  # a thread per physical core less those other processes keep busy
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

    result = score(args, llm, ids, context, progress)
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


def score(args, llm, ids: list[int], context: int, progress):
    """``score_token_ids`` of ``ids`` as the flags say, after checking (unless --no-preflight) that the largest
    forward's logits fit in the free memory; an allocation failure in a forward says which flags to lower."""
    import torch

    from nonstop.engine.perplexity import largest_forward, score_token_ids
    from nonstop.program.preflight import allocation_failed

    scored = len(ids) - 1 if args.max_tokens is None else min(len(ids) - 1, args.max_tokens)
    windows, window = largest_forward(scored, context, args.batch_size)
    if args.preflight:
        check_logits_memory(args.batch_size, context, windows, window, llm.cfg.vocab_size, llm.device)
    try:
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
    except (MemoryError, RuntimeError) as exc:
        if not allocation_failed(exc):
            raise
        raise ValueError(
            f"out of memory scoring {windows} window(s) of {window} tokens a forward: "
            f"{lower_hint(args.batch_size, context)}"
        ) from None
    if math.isnan(result.total_nll):  # an overflow to +inf is a result (perplexity inf); a NaN is none
        dtype = str(llm.dtype).replace("torch.", "")
        raise ValueError(
            f"the model's logits are not finite in {dtype} (the negative log-likelihood is NaN): "
            + ("try --dtype bfloat16 or float32" if dtype == "float16" else "the checkpoint's weights may be broken")
        )
    return result


UTF8_BOM = b"\xef\xbb\xbf"
PREFIX_CHUNK_BYTES = 1 << 20  # a file read by prefixes (--max-tokens) is read at least this much at a time


def _regular_file(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file" if not path.exists() else f"{path}: not a regular file")


def _not_utf8(path: Path, exc: UnicodeDecodeError, at: int) -> ValueError:
    """The error for bytes that are not UTF-8 at byte ``at`` of the file (counting a byte-order mark)."""
    return ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {at})")


def read_text(path: Path) -> str:
    """The text of ``path`` as UTF-8, byte for byte: line ends kept as written (``\\r\\n`` is two characters to
    score, not one), a leading byte-order mark dropped (it marks the encoding; it is not text)."""
    _regular_file(path)
    data = path.read_bytes()
    bom = len(UTF8_BOM) if data.startswith(UTF8_BOM) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc, bom + exc.start) from None


class FilePrefixes:
    """``read(n)`` -> (the first ``n`` characters of a UTF-8 file, whether they are all of it), as ``read_text``
    decodes it, reading no more of the file than that (and a chunk): ``leading_token_ids`` reads a large file
    by prefixes with --max-tokens, so a few tokens of a corpus of gigabytes cost megabytes."""

    def __init__(self, path: Path):
        import codecs

        _regular_file(path)
        self.path = path
        self.size = path.stat().st_size
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.parts: list[str] = []
        self.chars = 0
        self.offset = 0  # bytes read
        self.ended = False

    def __call__(self, n: int | None) -> tuple[str, bool]:
        while not self.ended and (n is None or self.chars <= n):  # one character past n: is there more?
            self._read(PREFIX_CHUNK_BYTES if n is None else max(PREFIX_CHUNK_BYTES, n + 1 - self.chars))
        text = "".join(self.parts)
        self.parts = [text]
        return (text if n is None else text[:n]), self.ended and (n is None or n >= len(text))

    def _read(self, size: int) -> None:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read(max(size, len(UTF8_BOM)) if self.offset == 0 else size)  # a BOM is read whole
        self.ended = not chunk
        if self.offset == 0 and chunk.startswith(UTF8_BOM):
            chunk, self.offset = chunk[len(UTF8_BOM) :], len(UTF8_BOM)
        pending = len(self.decoder.getstate()[0])  # bytes of a character cut by the last chunk
        try:
            piece = self.decoder.decode(chunk, final=self.ended)
        except UnicodeDecodeError as exc:
            raise _not_utf8(self.path, exc, self.offset - pending + exc.start) from None
        self.offset += len(chunk)
        self.parts.append(piece)
        self.chars += len(piece)


def no_tokenizer_message(model_dir, vocab_size: int) -> str:
    """Why a checkpoint without tokenizer files cannot be scored, and what to do: ``--tokenizer bytes`` only
    where the vocabulary holds every byte value."""
    from nonstop.engine.tokenizer import TOKENIZER_FILES
    from nonstop.weights.synth import BYTE_VOCAB

    missing = f"{model_dir} has no tokenizer ({' or '.join(TOKENIZER_FILES)}): perplexity scores text"
    if vocab_size >= BYTE_VOCAB:
        return (
            f"{missing}; give --tokenizer bytes to score its UTF-8 bytes as token ids, or add the tokenizer files to "
            "the checkpoint"
        )
    return (
        f"{missing}; add the tokenizer files to the checkpoint (its vocabulary of {vocab_size} ids is too small for "
        f"the {BYTE_VOCAB} byte values of --tokenizer bytes)"
    )


def lower_hint(batch_size: int, context: int) -> str:
    """What to lower when scoring does not fit in memory."""
    return f"lower --batch-size (now {batch_size}) or --context (now {context})"


def check_logits_memory(batch_size: int, context: int, windows: int, window: int, vocab: int, device) -> None:
    """PreflightError when the logits of the largest forward (``windows`` windows of ``window`` tokens over
    ``vocab`` ids, ``engine.perplexity.logits_bytes``) exceed the memory free on ``device`` now, weights loaded."""
    from nonstop.engine.perplexity import SCORING_LOGIT_COPIES, logits_bytes
    from nonstop.program.preflight import OVERRIDE_HINT, PreflightError, available_memory, memory_place, size_text

    need, free = logits_bytes(windows, window, vocab), available_memory(device)
    if need > free:
        raise PreflightError(
            f"scoring {windows} window(s) of {window} tokens a forward needs {size_text(need)} for the logits alone "
            f"({SCORING_LOGIT_COPIES} fp32 copies of {vocab:,} per token); {memory_place(device)} has "
            f"{size_text(free)} free: {lower_hint(batch_size, context)} ({OVERRIDE_HINT})"
        )
