"""Train a byte-level BPE tokenizer on the training corpus.

The tokenizer is a Hugging Face ``tokenizers`` BPE model with a ByteLevel
pre-tokenizer and decoder and no normalizer, so ``decode(encode(text))``
returns ``text`` exactly for any string (every byte is in the vocabulary).
The ids 0, 1 and 2 are reserved for the special tokens ``<|bos|>``,
``<|eos|>`` and ``<|pad|>``.  No post-processor is installed: callers add
``<|bos|>`` / ``<|eos|>`` themselves where they want them.

Two files are written:

* ``tokenizer.json`` -- the full ``tokenizers`` model;
* ``tokenizer_config.json`` -- special-token strings, ``model_max_length``
  and a chat template (see :data:`CHAT_TEMPLATE`), in the layout
  ``transformers.PreTrainedTokenizerFast`` reads.

Run as ``python -m nonstop.train.tokenizer --corpus build/corpus --out build/tokenizer``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from nonstop.train.corpus import DOC_SEPARATOR, iter_documents
from nonstop.weights.write import check_output_dir

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)  # ids 0, 1, 2
DEFAULT_VOCAB_SIZE = 6144
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256  # every byte value plus the special tokens
MAX_VOCAB_SIZE = 2**16  # ids 0..65535: the uint16 token streams of nonstop.train.tokens
DEFAULT_MODEL_MAX_LENGTH = 1024

assert EOS_TOKEN == DOC_SEPARATOR  # the corpus marks document ends with the EOS token

#: Chat template (Jinja).  Each message becomes a role marker line and a
#: content line, e.g. ``<|user|>\nHello\n``; the whole conversation starts
#: with ``<|bos|>``.  With ``add_generation_prompt`` (the usual Hugging Face
#: flag, set by the engine when it wants a reply) it ends with
#: ``<|assistant|>\n`` so the model continues as the assistant.  The role
#: markers are ordinary text, not special tokens.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def log(message: str) -> None:
    """Print a progress line."""
    print(f"[tokenizer] {message}", flush=True)


def build_tokenizer() -> Tokenizer:
    """An untrained byte-level BPE tokenizer (no normalizer, no post-processor)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    *,
    min_frequency: int = 2,
    show_progress: bool = False,
) -> Tokenizer:
    """Train on ``texts``; special tokens get ids 0, 1, 2 and all 256 bytes are in the vocabulary."""
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE}")
    tokenizer = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[AddedToken(tok, special=True, normalized=False) for tok in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        actual = tokenizer.token_to_id(token)
        if actual != expected_id:
            raise RuntimeError(f"special token {token} got id {actual}, expected {expected_id}")
    return tokenizer


def tokenizer_config(model_max_length: int = DEFAULT_MODEL_MAX_LENGTH) -> dict:
    """The ``tokenizer_config.json`` contents."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "model_max_length": model_max_length,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def save_tokenizer(tokenizer: Tokenizer, out_dir: Path, model_max_length: int = DEFAULT_MODEL_MAX_LENGTH) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = tokenizer_config(model_max_length)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def bytes_per_token(tokenizer: Tokenizer, texts: Iterable[str]) -> float:
    """Average UTF-8 bytes per token over ``texts`` (higher means better compression)."""
    n_bytes = n_tokens = 0
    for text in texts:
        n_bytes += len(text.encode("utf-8"))
        n_tokens += len(tokenizer.encode(text, add_special_tokens=False).ids)
    return n_bytes / max(n_tokens, 1)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m nonstop.train.tokenizer",
        description="Train a byte-level BPE tokenizer on the corpus written by nonstop.train.corpus.",
    )
    parser.add_argument("--corpus", type=Path, default=Path("build/corpus"), help="corpus directory (train.txt)")
    parser.add_argument("--out", default="build/tokenizer", help="output directory (created if missing)")
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=DEFAULT_VOCAB_SIZE,
        help=f"vocabulary size (at least {MIN_VOCAB_SIZE}: 256 bytes and the special tokens)",
    )
    parser.add_argument("--min-frequency", type=int, default=2, help="minimum pair count for a merge")
    parser.add_argument("--model-max-length", type=int, default=DEFAULT_MODEL_MAX_LENGTH)
    args = parser.parse_args(argv)
    if not MIN_VOCAB_SIZE <= args.vocab_size <= MAX_VOCAB_SIZE:
        parser.error(
            f"--vocab-size must be in {MIN_VOCAB_SIZE}..{MAX_VOCAB_SIZE} (256 bytes and the special tokens at "
            f"least; training stores ids as uint16), got {args.vocab_size}"
        )
    if args.min_frequency < 0:
        parser.error(f"--min-frequency must be a non-negative integer, got {args.min_frequency}")
    if args.model_max_length < 1:
        parser.error(f"--model-max-length must be a positive integer, got {args.model_max_length}")
    try:
        args.out = check_output_dir(args.out, "--out", "the tokenizer")
    except ValueError as exc:
        parser.error(str(exc))

    train_path = args.corpus / "train.txt"
    if not train_path.is_file():
        hint = f"run `python -m nonstop.train.corpus --out {args.corpus}` first"
        print(f"error: {train_path} not found; {hint}", file=sys.stderr)
        return 1
    try:
        documents = list(iter_documents(train_path))
        heldout_path = args.corpus / "heldout.txt"
        heldout = list(iter_documents(heldout_path)) if heldout_path.exists() else []
    except ValueError as exc:  # not UTF-8, or not a regular file
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not documents:
        print(f"error: {train_path} holds no text to train on; rebuild the corpus", file=sys.stderr)
        return 1
    log(f"training on {len(documents)} documents from {train_path} (vocab {args.vocab_size}) ...")
    start = time.perf_counter()
    tokenizer = train_tokenizer(documents, args.vocab_size, min_frequency=args.min_frequency)
    log(f"trained in {time.perf_counter() - start:.1f}s, vocab size {tokenizer.get_vocab_size()}")
    save_tokenizer(tokenizer, args.out, args.model_max_length)
    log(f"wrote {args.out}/tokenizer.json and tokenizer_config.json")

    if heldout:
        for text in heldout:
            if tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) != text:
                print("error: tokenizer does not round-trip held-out text", file=sys.stderr)
                return 1
        log(f"held-out: {bytes_per_token(tokenizer, heldout):.3f} bytes/token (round-trip exact)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
