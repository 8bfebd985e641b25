"""Arguments shared by several subcommands."""

from __future__ import annotations

import argparse
import contextlib
import math

from nonstop.program.ir import MAX_STEP_ROWS
from nonstop.program.preflight import three_digits

# weight dtypes a command that counts or writes bytes takes (``weights.resolve.DTYPES``'s names and aliases)
DTYPE_CHOICES = ("float32", "bfloat16", "float16", "fp32", "bf16", "fp16")


def add_model_args(p: argparse.ArgumentParser, backend: bool = True, text: bool = False) -> None:
    """The model flags; ``text``: the command reads text (chat, perplexity), so ``--tokenizer ids`` is not
    offered."""
    p.add_argument(
        "--model",
        "-m",
        default="k3-nano",
        help=(
            "checkpoint directory (HF config.json + safetensors), a bundled model (k3-nano, the default) or a preset "
            "name (random weights)"
        ),
    )
    p.add_argument("--dtype", default="auto", help="float32 | bfloat16 | float16 | auto (fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    if backend:
        p.add_argument(
            "--backend",
            default="auto",
            choices=["auto", "reference", "superop", "megakernel", "cpu", "cpu-bf16", "cpu-int8"],
            help="executor: auto (cpu on a CPU, reference elsewhere and under --tp/--ep/--world), reference (plain "
            "torch, the oracle), superop "
            "(Triton super-operators), megakernel (one persistent kernel), cpu (the step compiled for CPUs; the "
            "first use of a step shape compiles, cached under ~/.cache/nonstop), cpu-bf16 / cpu-int8 (the same "
            "with 16-bit / 8-bit weight-only quantised weights); a multi-rank layout runs reference or superop",
        )
    p.add_argument(
        "--tokenizer",
        default="auto",
        choices=["auto", "bytes"] if text else ["auto", "ids", "bytes"],
        help="auto: the checkpoint's tokenizer.json or tiktoken.model"
        + (
            "; bytes: UTF-8 bytes as token ids"
            if text
            else " (without one, prompts must be token ids); ids: no tokenizer, token ids in and out; bytes: UTF-8 "
            "bytes as token ids"
        ),
    )
    p.add_argument(
        "--no-preflight",
        dest="preflight",
        action="store_false",
        help="skip the checks that the model fits in free memory before it loads (perplexity: and its logits)",
    )
    add_threads_arg(p)


def thread_count(text: str) -> int:
    """--threads: a positive integer, at most ``threads.THREADS_PER_CPU_LIMIT`` per CPU."""
    from nonstop.threads import check_thread_count

    try:
        return check_thread_count(positive_int(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--threads ")) from None


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads",
        type=thread_count,
        default=None,
        help="CPU threads torch computes with (default: NONSTOP_THREADS or OMP_NUM_THREADS, else on the cpu "
        "backend one per physical core less those other processes keep busy - one for a model under 4 MB a token; "
        "torch's choice on the other backends)",
    )


def add_sampling_args(p: argparse.ArgumentParser, chat: bool = True) -> None:
    """Sampling flags; those not given take the checkpoint's generation_config.json defaults. ``chat``: the
    command renders a chat template (so it takes --chat-template)."""
    checkpoint = "default: the checkpoint's generation_config.json, else"
    p.add_argument("--max-tokens", "-n", type=positive_int, default=None, help=f"tokens to generate ({checkpoint} 64)")
    p.add_argument("--temperature", "-t", type=float, default=None, help=f"0 = greedy; > 0 samples ({checkpoint} 0)")
    p.add_argument("--top-p", type=float, default=None, help=f"nucleus sampling mass ({checkpoint} 1 = off)")
    p.add_argument(
        "--top-k", type=int, default=None, help=f"sample among the k most likely tokens ({checkpoint} -1 = off)"
    )
    p.add_argument(
        "--min-p",
        type=float,
        default=None,
        help=f"drop tokens less likely than min_p x the most likely one ({checkpoint} 0 = off)",
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=None,
        help=f"divide positive / multiply negative logits of tokens already seen ({checkpoint} 1 = off)",
    )
    p.add_argument(
        "--presence-penalty",
        type=float,
        default=None,
        help="subtract from the logits of tokens already generated, in [-2, 2] (default 0)",
    )
    p.add_argument(
        "--frequency-penalty",
        type=float,
        default=None,
        help="subtract this x the count of each token already generated, in [-2, 2] (default 0)",
    )
    p.add_argument("--seed", type=int, default=None, help="sampling seed")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    add_checkpoint_file_args(p, chat)


def add_checkpoint_file_args(p: argparse.ArgumentParser, chat: bool = True) -> None:
    """--chat-template (``chat``: for commands that render one) / --ignore-generation-config: replace or ignore
    files beside the weights."""
    if chat:
        p.add_argument(
            "--chat-template", default=None, help="jinja chat template file to use instead of the checkpoint's"
        )
    p.add_argument(
        "--ignore-generation-config",
        dest="generation_config",
        action="store_false",
        help="do not take sampling defaults from the checkpoint's generation_config.json",
    )


CLI_DEFAULTS = {"max_tokens": 64, "temperature": 0.0}  # when neither the flags nor the checkpoint say


def sampling_from_args(args, defaults: dict | None = None):
    """SamplingParams: the flags given, over ``defaults`` (the checkpoint's), over ``CLI_DEFAULTS``. Called
    once with no defaults before loading a model, so a bad flag fails fast."""
    from nonstop.engine.sampling import SamplingParams

    given = {
        k: getattr(args, k)
        for k in (
            "max_tokens",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
            "seed",
            "stop",
        )
    }
    fields = {**CLI_DEFAULTS, **(defaults or {}), **{k: v for k, v in given.items() if v is not None}}
    return SamplingParams(**fields, ignore_eos=args.ignore_eos)


def llm_from_args(args, cls=None, **kw):
    """The ``LLM`` (or ``cls``, e.g. a rank's ``DistributedLLM``) the model flags describe (``--threads``
    applied first)."""
    from nonstop.engine.llm import LLM
    from nonstop.threads import set_threads

    set_threads(args.threads)
    extra = {"chat_template": args.chat_template} if getattr(args, "chat_template", None) else {}
    if hasattr(args, "generation_config"):
        extra["generation_config"] = args.generation_config
    if hasattr(args, "backend"):
        extra["backend"] = args.backend
    return (cls or LLM)(
        args.model,
        dtype=args.dtype,
        device=args.device,
        tokenizer=args.tokenizer,
        preflight=args.preflight,
        **extra,
        **kw,
    )


def stream_text(llm, params, ids: list[int]):
    """``llm.stream`` of ``ids`` with its text printed as it comes; whatever ends the stream early (an error, a
    rank that died, Ctrl-C) ends the streamed line first, so its own line on stderr starts a line of its own."""
    try:
        return llm.stream(None, params, prompt_ids=ids, on_text=lambda piece: print(piece, end="", flush=True))
    except BaseException:
        with contextlib.suppress(OSError, ValueError):  # stdout closed or a broken pipe: nothing to end
            print(flush=True)
        raise


def check_utf8_args(named: dict[str, str | list[str] | None]) -> None:
    """Refuse a free-text argument that is not valid UTF-8, before anything loads: ``named`` maps how the
    error names each argument ("the prompt", "--stop") to its text (a list: each one; None: not given).
    Python decodes argument bytes that are not UTF-8 to lone surrogates U+DC80..U+DCFF (surrogateescape),
    which the error gives back as the byte they stand for."""
    from nonstop.engine.tokenizer import lone_surrogate

    for what, value in named.items():
        for text in [value] if isinstance(value, str) else value or ():
            at = lone_surrogate(text)
            if at is None:
                continue
            code = ord(text[at])
            if 0xDC80 <= code <= 0xDCFF:
                raise ValueError(f"{what} is not valid UTF-8 (byte 0x{code - 0xDC00:02x} at character {at})")
            raise ValueError(f"{what} holds a lone surrogate U+{code:04X} at character {at}: not valid Unicode")


def parse_token_ids(text: str) -> list[int]:
    """Token ids separated by commas or spaces ("1,15,27", "1 15 27", "1, 15"); an empty item between two
    commas ("1,,27") is refused rather than skipped (a missing id)."""
    items = [item.split() for item in text.split(",")]
    try:
        ids = [int(t) for words in items for t in words]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"token ids must be integers separated by commas or spaces, got {text!r}"
        ) from None
    if not ids:
        raise argparse.ArgumentTypeError("give at least one token id")
    if any(not words for words in items):
        raise argparse.ArgumentTypeError(f"token ids: an empty item between commas in {text!r}")
    return ids


def _int_at_least(text: str, minimum: int, kind: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {kind} integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected a {kind} integer, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "positive")


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "non-negative")


def _finite_float(text: str, positive: bool) -> float:
    """A finite number, > 0 or >= 0 (``float()`` alone lets ``nan`` and ``inf`` through, and ``nan <= 0``
    is False, so a plain range check misses them)."""
    kind = "positive" if positive else "non-negative"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {kind} number, got {text!r}") from None
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        raise argparse.ArgumentTypeError(f"expected a {kind} finite number, got {text}")
    return value


def seed_int(text: str) -> int:
    """A random seed torch accepts: an integer in [-2^63, 2^64)."""
    value = _int_at_least(text, -(2**63), "seed")
    if value >= 2**64:
        raise argparse.ArgumentTypeError(f"a seed must lie in [-2^63, 2^64), got {value}")
    return value


def positive_float(text: str) -> float:
    return _finite_float(text, True)


def non_negative_float(text: str) -> float:
    return _finite_float(text, False)


def add_spec_args(p: argparse.ArgumentParser) -> None:
    """--speculative / --num-draft-tokens (see ``nonstop.engine.speculative``)."""
    p.add_argument(
        "--speculative",
        choices=["ngram", "dspark"],
        default=None,
        help=(
            "speculative decoding: draft tokens with prompt lookup (ngram) or the model's DSpark drafter (dspark) and "
            "verify them in one step; outputs stay those of plain decoding"
        ),
    )
    p.add_argument(
        "--num-draft-tokens",
        type=int,
        default=None,
        help=f"tokens drafted per step with --speculative (default 4; 0..{MAX_STEP_ROWS - 1}; dspark: at most its "
        "drafter's block size, 7 for k3-nano's)",
    )


def spec_from_args(args) -> dict | None:
    """The ``LLM(speculative=...)`` dict for the parsed flags (None without --speculative)."""
    if args.speculative is None:
        if args.num_draft_tokens is not None:
            raise ValueError("--num-draft-tokens applies to speculative decoding: give --speculative ngram or dspark")
        return None
    drafts = 4 if args.num_draft_tokens is None else args.num_draft_tokens
    return {"method": args.speculative, "num_tokens": drafts}


def human(n: float, unit: str = "") -> str:
    """``n`` with 3 significant digits and a K/M/G/T/P suffix (powers of 1000), e.g. 9.06M, 18.1MB; below
    1000 a whole number (512)."""
    if abs(round(n)) < 1000:
        return f"{n:.0f}{unit}"
    digits, suffix = three_digits(n, ("", "K", "M", "G", "T", "P"))
    return f"{digits}{suffix}{unit}"
