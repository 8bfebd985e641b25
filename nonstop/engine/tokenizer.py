"""Tokenizers: a checkpoint's ``tokenizer.json`` via HF ``tokenizers``, or a byte-level fallback."""

from __future__ import annotations

import json
from pathlib import Path


class TokenizerError(ValueError):
    pass


class Tokenizer:
    """encode(text) -> ids, decode(ids) -> text, plus the special tokens the engine needs."""

    name = "base"
    chat_template: str | None = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens=False`` leaves out BOS and the like (for text
        rendered by a chat template, which writes its own)."""
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])

    @staticmethod
    def load(model_dir: str | Path | None, vocab_size: int) -> "Tokenizer":
        """The checkpoint's tokenizer.json if there is one, else bytes as token ids."""
        if model_dir is not None and (Path(model_dir) / "tokenizer.json").exists():
            return HFTokenizer(Path(model_dir), vocab_size)
        return ByteTokenizer(vocab_size)


class HFTokenizer(Tokenizer):
    name = "tokenizer.json"

    def __init__(self, model_dir: Path, vocab_size: int):
        from tokenizers import Tokenizer as _Tok

        try:
            self.tok = _Tok.from_file(str(model_dir / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises its own Exception type
            raise TokenizerError(f"{model_dir / 'tokenizer.json'}: cannot load tokenizer ({exc})") from None
        self.vocab_size = vocab_size
        config_path = model_dir / "tokenizer_config.json"
        self.config = json.loads(config_path.read_text()) if config_path.exists() else {}
        self.chat_template = self.config.get("chat_template")
        self.special_ids = {i for i, t in self.tok.get_added_tokens_decoder().items() if t.special}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=add_special_tokens).ids
        bad = [i for i in ids if i >= self.vocab_size]
        if bad:
            raise TokenizerError(f"tokenizer produced id {bad[0]} outside the model's vocabulary of {self.vocab_size}")
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def token_id(self, text: str) -> int | None:
        return self.tok.token_to_id(text)


class ByteTokenizer(Tokenizer):
    """Token id = UTF-8 byte value; ids of 256 and above decode to ``<|id|>``."""

    name = "bytes"

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        if any(i >= self.vocab_size for i in ids):
            raise TokenizerError(
                f"this checkpoint has no tokenizer.json and its vocabulary ({self.vocab_size}) cannot hold every byte of the text; pass token ids instead"
            )
        return ids

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
