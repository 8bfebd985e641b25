"""The corpus as one stream of token ids, tokenized once and cached as a numpy file.

Stream layout: for every document of ``train.txt`` / ``heldout.txt`` (see ``corpus.iter_documents``),
``encode(text) + [eos_id]`` -- the ``<|eos|>`` separator line becomes the single EOS id; no BOS
(the engine does not add one to prompts either). Ids are stored as uint16 (vocabularies < 65536).

The cache file name carries a digest of the text file and of ``tokenizer.json``, so a new corpus or
tokenizer is tokenized again and a stale cache is never read. The file is written whole or not at all
(a temporary file renamed over it); one that cannot be read (emptied, cut short) is tokenized again.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np

from nonstop.train.corpus import iter_documents
from nonstop.train.tokenizer import EOS_TOKEN, MAX_VOCAB_SIZE
from nonstop.weights.write import write_atomically

DEFAULT_CACHE_DIR = Path("build/tokens")


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


def load_tokenizer(tokenizer_dir: Path):
    """The HF ``tokenizers.Tokenizer`` of ``tokenizer_dir/tokenizer.json``."""
    from tokenizers import Tokenizer

    path = Path(tokenizer_dir) / "tokenizer.json"
    if path.exists() and not path.is_file():
        raise ValueError(f"{path}: not a regular file")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; build it with `python -m nonstop.train.tokenizer`")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for a malformed file
        raise ValueError(f"{path}: cannot load tokenizer ({exc})") from None


def encode_documents(text_path: Path, tokenizer) -> np.ndarray:
    """Token ids [N] (uint16) of every document of ``text_path``, each followed by the EOS id."""
    eos = tokenizer.token_to_id(EOS_TOKEN)
    if eos is None:
        raise ValueError(f"tokenizer has no {EOS_TOKEN} token")
    if tokenizer.get_vocab_size() > MAX_VOCAB_SIZE:
        raise ValueError(
            f"a vocabulary of {tokenizer.get_vocab_size()} tokens is too large for uint16 token ids "
            f"(at most {MAX_VOCAB_SIZE})"
        )
    documents = list(iter_documents(Path(text_path)))
    encoded = tokenizer.encode_batch(documents, add_special_tokens=False)
    pieces = [np.asarray(e.ids + [eos], dtype=np.uint16) for e in encoded]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint16)


def cached_token_ids(text_path: Path, tokenizer_dir: Path, cache_dir: Path = DEFAULT_CACHE_DIR, log=None) -> np.ndarray:
    """``encode_documents`` of ``text_path``, read from / written to ``cache_dir`` (``<stem>-<digest>.npy``;
    a cache file that cannot be read is replaced, with a note through ``log``, else on stderr)."""
    text_path, tokenizer_dir, cache_dir = Path(text_path), Path(tokenizer_dir), Path(cache_dir)
    if text_path.exists() and not text_path.is_file():
        raise ValueError(f"{text_path}: not a regular file")
    if not text_path.is_file():
        raise FileNotFoundError(f"{text_path} not found; build the corpus with `python -m nonstop.train.corpus`")
    tokenizer_json = tokenizer_dir / "tokenizer.json"
    tokenizer = load_tokenizer(tokenizer_dir)
    cache = cache_dir / f"{text_path.stem}-{_digest(text_path, tokenizer_json)}.npy"
    if cache.is_file():
        try:
            ids = np.load(cache)
            if ids.ndim != 1 or ids.dtype != np.uint16:
                raise ValueError(f"it holds {ids.dtype} {ids.shape}, not a stream of uint16 ids")
            return ids
        except (EOFError, ValueError, OSError) as exc:  # empty, cut short or not a .npy file
            note = log or (lambda message: print(f"nonstop: {message}", file=sys.stderr, flush=True))
            note(f"{cache} is unreadable ({type(exc).__name__}: {exc}): tokenizing {text_path} again")
    ids = encode_documents(text_path, tokenizer)
    write_atomically(cache, lambda f: np.save(f, ids))  # an interrupted write leaves no half file
    if log is not None:
        log(f"tokenized {text_path} -> {len(ids):,} tokens, cached in {cache}")
    return ids
