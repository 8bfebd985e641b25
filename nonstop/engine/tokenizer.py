"""Tokenizers of a checkpoint, found the way its files ship them.

* ``tokenizer.json`` (HF ``tokenizers``): Llama, DeepSeek, k3-nano, synthetic checkpoints.
* ``tiktoken.model`` (the ``tiktoken`` package): Kimi K2 / Kimi Linear / Kimi K3. The file holds one
  ``<base64 token bytes> <rank>`` line per base token; the special tokens take the 256 + 2 ids after
  the base vocabulary (no more than the model's vocabulary holds: K3's has 256), named by
  ``added_tokens_decoder`` in ``tokenizer_config.json`` (unnamed ones ``<|reserved_token_{id}|>``), and
  the pre-tokeniser is Kimi's regex (Han runs apart from other letters). Special tokens written in the
  text (as chat templates write them) encode as themselves; decoding leaves out only those transformers
  skips (``TiktokenTokenizer``), so ``<think>`` and the tool-call markers stay in the text.
* neither: ``IdTokenizer``, which refuses text (give token ids) and decodes to nothing, so nothing
  is silently read as bytes. ``ByteTokenizer`` (token id = UTF-8 byte) serves presets with random
  weights and is chosen explicitly with ``tokenizer="bytes"``.

The chat template comes from ``--chat-template FILE``, else ``chat_template.jinja`` beside the
weights, else ``chat_template`` in ``tokenizer_config.json`` (a string, or the ``default`` entry of a
list of named templates), as transformers resolves it. Every file error names the file.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from pathlib import Path

from nonstop.jsonfile import read_json_object

TOKENIZER_FILES = ("tokenizer.json", "tiktoken.model")
MODES = ("auto", "ids", "bytes")


class TokenizerError(ValueError):
    pass


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone UTF-16 surrogate in ``text`` (not valid Unicode: JSON can spell one, and
    Python decodes bytes that are not UTF-8 in ``sys.argv`` to U+DC80..U+DCFF), else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def check_text(text: str, what: str = "text") -> None:
    """Refuse text that is not valid Unicode (``lone_surrogate``), naming it ``what``."""
    at = lone_surrogate(text)
    if at is not None:
        raise TokenizerError(
            f"{what} holds a lone surrogate U+{ord(text[at]):04X} at character {at}: not valid Unicode"
        )


def _special_text(value) -> str:
    """A special token as tokenizer_config.json spells it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


# the special tokens transformers names (``SPECIAL_TOKENS_ATTRIBUTES``)
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _added_token(value) -> str | None:
    """A model-specific special token's text: a string or an AddedToken ({"__type": "AddedToken", "content": ...})."""
    if isinstance(value, dict) and value.get("__type") == "AddedToken":
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens_map(config: dict) -> dict[str, str]:
    """{name: text} of the special tokens in tokenizer_config.json, as transformers 5 gives them to chat templates
    (``special_tokens_map``): the named ones (``NAMED_SPECIAL_TOKENS``) that are set, a string or {"content": ...};
    any other ``*_token`` key holding a string or an AddedToken (``image_token``); and the entries of
    ``extra_special_tokens`` when it is an object of names (where it is empty, ``additional_special_tokens``
    stands for it; beside it, that object's entries come first and lose to the others). A list of extra tokens
    names none, so templates do not see it."""
    named = {k: _special_text(config[k]) for k in NAMED_SPECIAL_TOKENS if isinstance(config.get(k), (str, dict))}
    keys = {
        k: config[k] for k in config if isinstance(k, str) and k.endswith("_token") and k not in NAMED_SPECIAL_TOKENS
    }
    extra, additional = config.get("extra_special_tokens"), config.get("additional_special_tokens")
    if not extra:
        tables = [keys, additional]
    elif isinstance(extra, dict):
        tables = [additional, keys, extra]
    else:
        tables = [keys]
    for table in tables:
        if isinstance(table, dict):
            named.update({k: text for k, v in table.items() if (text := _added_token(v)) is not None})
    return named


class Tokenizer:
    """encode(text) -> ids, decode(ids) -> text, plus the special tokens and the chat template."""

    name = "base"
    chat_template: str | None = None
    accepts_text = True

    def __init__(self, vocab_size: int, config: dict | None = None):
        self.vocab_size = vocab_size
        self.config = config or {}
        self.bos_token = _special_text(self.config.get("bos_token"))
        self.eos_token = _special_text(self.config.get("eos_token"))
        self.special_tokens = special_tokens_map(self.config)  # the names a chat template sees

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens=False`` leaves out BOS and the like (for text
        rendered by a chat template, which writes its own)."""
        check_text(text)
        ids = self._encode(text, add_special_tokens)
        bad = [i for i in ids if i >= self.vocab_size]
        if bad:
            raise TokenizerError(f"tokenizer produced id {bad[0]} outside the model's vocabulary of {self.vocab_size}")
        return ids

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    def token_text(self, token_id: int) -> str:
        """One token as text for a logprobs listing: a special token (which ``decode`` leaves out) by its
        name, e.g. ``<|im_end|>``; a token whose bytes are not UTF-8 on their own (part of a character) as
        ``bytes:\\xe2\\x80``, as OpenAI lists them, so distinct tokens never share one text."""
        name = self.special_name(token_id)
        if name:
            return name
        raw = self.token_bytes(token_id)
        if raw is not None:
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        return self.decode([token_id])

    def special_name(self, token_id: int) -> str | None:
        return None

    def left_out(self, token_id: int) -> bool:
        """Whether ``decode`` leaves the token out of the text (a special token it skips)."""
        return self.special_name(token_id) is not None

    def token_bytes(self, token_id: int) -> bytes | None:
        """The token's own bytes, where the tokenizer is byte-level and says them (else None)."""
        return None

    @staticmethod
    def load(
        model_dir: str | Path | None, vocab_size: int, mode: str = "auto", chat_template: str | Path | None = None
    ) -> Tokenizer:
        """The checkpoint's tokenizer (``mode`` auto), ``IdTokenizer`` (ids, or auto with no tokenizer
        files), ``ByteTokenizer`` (bytes, or auto for a preset: ``model_dir`` None)."""
        if mode not in MODES:
            raise ValueError(f"tokenizer mode must be one of {', '.join(MODES)}, got {mode!r}")
        model_dir = Path(model_dir) if model_dir is not None else None
        config = {}
        if model_dir is not None and (model_dir / "tokenizer_config.json").exists():
            config = read_json_object(model_dir / "tokenizer_config.json", TokenizerError)
        if mode == "bytes" or (mode == "auto" and model_dir is None):
            tok: Tokenizer = ByteTokenizer(vocab_size, config)
        elif mode == "auto" and (model_dir / "tokenizer.json").exists():
            tok = HFTokenizer(model_dir, vocab_size, config)
        elif mode == "auto" and (model_dir / "tiktoken.model").exists():
            tok = TiktokenTokenizer(model_dir, vocab_size, config)
        else:
            tok = IdTokenizer(vocab_size, config, model_dir, chosen=mode == "ids")
        tok.chat_template = find_chat_template(model_dir, config, chat_template)
        return tok


def find_chat_template(model_dir: Path | None, config: dict, override: str | Path | None) -> str | None:
    """The chat template text: ``override`` (a file, or the text itself: a string holding ``{{`` or ``{%``),
    else chat_template.jinja, else tokenizer_config's."""
    if isinstance(override, str) and ("{{" in override or "{%" in override):
        return override
    if override is not None:
        path = Path(override)
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"chat template {path}: cannot read ({exc})") from None
    if model_dir is not None and (model_dir / "chat_template.jinja").exists():
        return find_chat_template(None, {}, model_dir / "chat_template.jinja")
    t = config.get("chat_template")
    if t is not None and not isinstance(t, (str, list)):
        raise TokenizerError(
            f"tokenizer_config.json: chat_template must be a string (or a list of named templates), got {t!r}"
        )
    if isinstance(t, list):
        t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
    return t if isinstance(t, str) and t else None


def declared_special(config: dict, added: dict) -> set[int]:
    """Ids of the added tokens (``added``: {id: AddedToken} of tokenizer.json) that tokenizer_config.json
    declares special although tokenizer.json may not: an ``added_tokens_decoder`` entry with
    ``special: true``, or a named special token (``NAMED_SPECIAL_TOKENS``: its eos_token ...). transformers
    merges both files, so such a token is left out of decoded text there too."""
    entries = config.get("added_tokens_decoder")
    ids = set()
    if isinstance(entries, dict):
        for key, entry in entries.items():
            if isinstance(entry, dict) and entry.get("special") is True and str(key).isdigit() and int(key) in added:
                ids.add(int(key))
    named = {_special_text(config.get(k)) for k in NAMED_SPECIAL_TOKENS} - {""}
    return ids | {i for i, t in added.items() if t.content in named}


class HFTokenizer(Tokenizer):
    name = "tokenizer.json"

    def __init__(self, model_dir: Path, vocab_size: int, config: dict | None = None):
        from tokenizers import Tokenizer as _Tok

        super().__init__(vocab_size, config)
        try:
            self.tok = _Tok.from_file(str(model_dir / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises its own Exception type
            raise TokenizerError(f"{model_dir / 'tokenizer.json'}: cannot load tokenizer ({exc})") from None
        added = self.tok.get_added_tokens_decoder()
        self.special_ids = {i for i, t in added.items() if t.special} | declared_special(self.config, added)
        self._added_ids = set(added)
        self._byte_level, self._byte_fallback = _decoder_kinds(self.tok)

    def token_bytes(self, token_id: int) -> bytes | None:
        """The bytes of a byte-level BPE token (its name spelt in GPT-2's byte alphabet, ``byte_level_
        alphabet``) or of a byte-fallback token ``<0xHH>``; None for an added token or any other decoder
        (``token_text`` then decodes it alone)."""
        if token_id in self._added_ids:
            return None
        name = self.tok.id_to_token(token_id)
        if name is None:
            return None
        if self._byte_fallback and len(name) == 6 and name.startswith("<0x") and name.endswith(">"):
            try:
                return bytes([int(name[3:5], 16)])
            except ValueError:
                return None
        if self._byte_level:
            to_byte = _byte_level_inverse()
            if all(c in to_byte for c in name):
                return bytes(to_byte[c] for c in name)
        return None

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        # encode_batch releases the GIL while it works (encode holds it: a long prompt would stall every
        # other thread, the server's event loop included)
        return self.tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids`` without the special tokens (``special_ids``: those tokenizer_config.json declares
        too, which tokenizers' own ``skip_special_tokens`` would keep)."""
        return self.tok.decode([i for i in ids if i not in self.special_ids], skip_special_tokens=True)

    def token_id(self, text: str) -> int | None:
        return self.tok.token_to_id(text)

    def special_name(self, token_id: int) -> str | None:
        return self.tok.id_to_token(token_id) if token_id in self.special_ids else None

    def _known(self, token_id: int) -> bool:
        """Whether tokenizer.json has the id: a model's vocabulary may be padded past it (``decode`` skips
        such ids, and joins the bytes on either side)."""
        return self.tok.id_to_token(token_id) is not None

    def left_out(self, token_id: int) -> bool:
        return token_id in self.special_ids or not self._known(token_id)

    def token_text(self, token_id: int) -> str:
        """``Tokenizer.token_text``; an id tokenizer.json does not have as ``<|id|>`` (as
        ``TiktokenTokenizer``), so that distinct ids never share the empty text."""
        return super().token_text(token_id) if self._known(token_id) else f"<|{token_id}|>"


def _decoder_kinds(tok) -> tuple[bool, bool]:
    """(byte-level, byte-fallback): whether the tokenizer's decoder, or one step of a Sequence of them, is
    ``ByteLevel`` / ``ByteFallback``."""
    import json

    if tok.decoder is None:
        return False, False
    decoder = json.loads(tok.decoder.__getstate__())  # the decoder's own JSON, as tokenizer.json spells it
    steps = decoder.get("decoders", [decoder])
    kinds = {step.get("type") for step in steps if isinstance(step, dict)}
    return "ByteLevel" in kinds, "ByteFallback" in kinds


@functools.cache
def _byte_level_inverse() -> dict[str, int]:
    """{character: byte} of GPT-2's byte-level alphabet: the printable bytes ``!``-``~``, ``¡``-``¬`` and
    ``®``-``ÿ`` stand for themselves; the other 68 bytes, in increasing order, for U+0100, U+0101, ..."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table


# Kimi's pre-tokeniser (tokenization_kimi.py of the Kimi K2 / Kimi Linear checkpoints): Han runs,
# cased words with English contractions (letters other than Han), 1-3 digits, punctuation runs,
# newlines and spaces. ``&&`` is a class intersection (tiktoken's regex engine supports it).
KIMI_PATTERN = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
KIMI_SPECIAL_IDS = 256 + 2  # special-token ids after the base vocabulary (K3's tokenizer: 256), up to the model's
# the chat markers Moonshot's tokenizer class skips in decode when tokenizer_config.json lists no
# additional_special_tokens (with bos / eos / unk / pad: transformers' all_special_ids)
KIMI_DEFAULT_ADDITIONAL = (
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "[EOT]",
    "<|im_system|>",
    "<|im_middle|>",
)
MAX_ENCODE_CHARS = 400_000  # tiktoken is fed slices of at most this many characters ...
MAX_RUN_CHARS = 25_000  # ... each without longer runs of whitespace or of non-whitespace


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """{token bytes: rank} from a tiktoken BPE file (``<base64> <rank>`` per line); ranks must be
    0..N-1, each once."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read ({exc})") from None
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except (ValueError, binascii.Error):
            raise TokenizerError(f"{path}: line {n} is not '<base64 token> <rank>': {line[:60]!r}") from None
        if token in ranks:
            raise TokenizerError(f"{path}: line {n}: token {token!r} listed twice")
        ranks[token] = rank
    if not ranks:
        raise TokenizerError(f"{path}: no tokens")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise TokenizerError(f"{path}: ranks must be 0..{len(ranks) - 1}, each once")
    return ranks


def _slices(text: str):
    """``text`` cut into pieces for tiktoken: at most MAX_ENCODE_CHARS characters, and a run of
    whitespace (or of non-whitespace) longer than MAX_RUN_CHARS cut every MAX_RUN_CHARS characters."""
    for start in range(0, len(text), MAX_ENCODE_CHARS):
        part = text[start : start + MAX_ENCODE_CHARS]
        cut = 0
        for run in re.finditer(r"\s+|\S+", part):
            for at in range(run.start() + MAX_RUN_CHARS, run.end(), MAX_RUN_CHARS):
                yield part[cut:at]
                cut = at
        yield part[cut:]


class TiktokenTokenizer(Tokenizer):
    """Kimi's tokenizer. ``decode`` follows Moonshot's class under transformers' ``skip_special_tokens=True``
    (what servers decode with): it leaves out transformers' ``all_special_ids`` only, the named special tokens
    (bos, eos, unk, pad ...) and ``additional_special_tokens`` (``KIMI_DEFAULT_ADDITIONAL`` where the config lists
    none); every other special id (``<think>``, the tool-call markers a tool parser reads, reserved ids) is
    written as its name. Ids the tokenizer does not know (a model vocabulary padded past it) have no text."""

    name = "tiktoken.model"

    def __init__(self, model_dir: Path, vocab_size: int, config: dict | None = None):
        import tiktoken

        super().__init__(vocab_size, config)
        path = model_dir / "tiktoken.model"
        ranks = read_tiktoken_ranks(path)
        base = len(ranks)
        named = self._named_specials(model_dir)
        block = base + max(0, min(KIMI_SPECIAL_IDS, vocab_size - base))  # no reserved id past the model's ids
        specials = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(base, block)}
        specials.update({text: i for i, text in named.items() if i >= block})
        try:
            self.enc = tiktoken.Encoding(
                path.name, pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=specials
            )
        except ValueError as exc:
            raise TokenizerError(f"{path}: cannot build the tokenizer ({exc})") from None
        self.base = base
        self.special_ids = set(specials.values())
        self.special_names = {i: text for text, i in specials.items()}
        self.skipped_ids = {specials[t] for t in self._skipped_names() if t in specials}

    def _named_specials(self, model_dir: Path) -> dict[int, str]:
        """{id: text} of ``added_tokens_decoder`` in tokenizer_config.json."""
        where = model_dir / "tokenizer_config.json"
        decoder = self.config.get("added_tokens_decoder") or {}
        if not isinstance(decoder, dict):
            raise TokenizerError(f"{where}: added_tokens_decoder must be an object of id -> token")
        out = {}
        for key, value in decoder.items():
            text = _special_text(value)
            if not (isinstance(key, str) and key.isdigit() and text):
                raise TokenizerError(f"{where}: added_tokens_decoder entry {key!r}: {value!r} is not id -> token")
            out[int(key)] = text
        return out

    def _skipped_names(self) -> list[str]:
        """The texts of transformers' ``all_special_tokens`` for this config: the named special tokens and
        ``additional_special_tokens`` (transformers 5 may write it ``extra_special_tokens``), else the class's."""
        names = [_special_text(self.config.get(k)) for k in NAMED_SPECIAL_TOKENS]
        extra = self.config.get("additional_special_tokens", self.config.get("extra_special_tokens"))
        listed = extra if isinstance(extra, list) and extra else KIMI_DEFAULT_ADDITIONAL
        return [t for t in names + [_special_text(v) for v in listed] if t]

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids: list[int] = []
        for piece in _slices(text):
            ids += self.enc.encode(piece, allowed_special="all")
        return ids

    def _known(self, token_id: int) -> bool:
        return 0 <= token_id < self.base or token_id in self.special_names

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` without those transformers skips (``skipped_ids``) and those it has no text for; the
        other special tokens by their names (see the class)."""
        return self.enc.decode([i for i in ids if self._known(i) and i not in self.skipped_ids])

    def left_out(self, token_id: int) -> bool:
        return token_id in self.skipped_ids or not self._known(token_id)

    def token_text(self, token_id: int) -> str:
        """``Tokenizer.token_text``; an id the tokenizer does not know as ``<|id|>`` (as ``ByteTokenizer`` writes
        its ids past the bytes), so that distinct ids never share the empty text."""
        return super().token_text(token_id) if self._known(token_id) else f"<|{token_id}|>"

    def token_id(self, text: str) -> int | None:
        try:
            return self.enc.encode_single_token(text)
        except KeyError:
            return None

    def special_name(self, token_id: int) -> str | None:
        return self.special_names.get(token_id)

    def token_bytes(self, token_id: int) -> bytes | None:
        """The bytes ``decode`` writes for the token: a base token's, or a special token's name."""
        return self.enc.decode_single_token_bytes(token_id) if self._known(token_id) else None


class ByteTokenizer(Tokenizer):
    """Token id = UTF-8 byte value; ids of 256 and above decode to ``<|id|>``."""

    name = "bytes"

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids = list(text.encode("utf-8"))
        if any(i >= self.vocab_size for i in ids):
            raise TokenizerError(
                f"this model's vocabulary ({self.vocab_size}) cannot hold every byte of the text; "
                "pass token ids instead"
            )
        return ids

    def token_bytes(self, token_id: int) -> bytes | None:
        return bytes([token_id]) if token_id < 256 else None

    def decode(self, ids: list[int]) -> str:
        out, pending = [], bytearray()
        for i in ids:
            if i < 256:
                pending.append(i)
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending = bytearray()
            out.append(f"<|{i}|>")
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)


class IdTokenizer(Tokenizer):
    """No tokenizer: prompts must be token ids, outputs are token ids (their text is empty)."""

    name = "none"
    accepts_text = False

    def __init__(
        self, vocab_size: int, config: dict | None = None, model_dir: Path | None = None, chosen: bool = False
    ):
        super().__init__(vocab_size, config)
        self.model_dir = model_dir
        self.chosen = chosen  # the caller asked for ids (``mode="ids"``), whatever tokenizer the checkpoint has

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if self.chosen:
            raise TokenizerError(
                "tokenizer 'ids' chosen (--tokenizer ids): text cannot be encoded; give token ids (--prompt-ids, "
                "prompt_token_ids) or leave the tokenizer at auto"
            )
        where = (
            f"{self.model_dir} has no tokenizer ({' or '.join(TOKENIZER_FILES)})" if self.model_dir else "no tokenizer"
        )
        raise TokenizerError(
            f"{where}: text cannot be encoded; give token ids (--prompt-ids, prompt_token_ids) "
            "or add the tokenizer files to the checkpoint"
        )

    def decode(self, ids: list[int]) -> str:
        return ""
