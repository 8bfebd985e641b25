"""Incremental detokenisation: the text of a growing token sequence at a cost per token that does not
depend on how long the sequence already is.

Two offsets into the ids: ``prefix`` (where the decode window starts) and ``read`` (the end of what
has been turned into text). Each new token decodes the window ids[prefix:] and the already-read part
ids[prefix:read]; the new text is the difference. When the window ends in an incomplete UTF-8
sequence (decoded as U+FFFD) nothing is emitted and the window grows until the character completes;
otherwise both offsets move forward (``prefix`` to the old ``read``, or kept where it is while the
tokens since are special tokens ``decode`` leaves out: ``_window_start``). Starting both decodes at
the same token keeps decoders that treat the first token of a call specially (SentencePiece's leading
space) consistent, so the pieces add up to ``tokenizer.decode(ids)`` for byte-level BPE, tiktoken,
SentencePiece and byte tokenizers, minus a trailing incomplete character (held back, as the
whole-sequence decode would show it as U+FFFD). Where the tokenizer says its tokens' bytes, only a character
later bytes can still complete is held (``ends_open``): a U+FFFD for bytes that can never be valid (a lone
continuation byte, 0xFF) or one the model wrote itself (EF BF BD, whole) is text, emitted at once, as
Python's incremental UTF-8 decoder (errors="replace") emits it; where it does not, every trailing U+FFFD
is held (up to MAX_PENDING tokens).

Windows span a few tokens (one character's worth), so each step decodes O(1) tokens.
"""

from __future__ import annotations

import codecs

INCOMPLETE = "\ufffd"
MAX_PENDING = 16  # tokens a window may wait for a character to complete; beyond: invalid bytes, emitted


class IncrementalDecoder:
    """Feed token ids one at a time with ``push``; each call returns the newly completed text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # the decode window starts here
        self.read = 0  # ids[:read] are text already
        self._read_text = ""  # decode(ids[prefix:read])

    def push(self, token: int) -> str:
        self.ids.append(token)
        window = self.tokenizer.decode(self.ids[self.prefix :])
        if window.endswith(INCOMPLETE) and len(self.ids) - self.read < MAX_PENDING:
            if ends_open(self.tokenizer, self.ids[self.prefix :]) is not False:  # unknown bytes: maybe open
                return ""
        new = window[len(self._read_text) :]
        self.prefix, self.read = self._window_start(self.read), len(self.ids)
        self._read_text = self.tokenizer.decode(self.ids[self.prefix :])
        return new

    def flush(self) -> str:
        """The text still held back when the sequence ends: ``decode(ids)`` past what was emitted, less only a
        last character later bytes could have completed (one U+FFFD; where the bytes are unknown, every trailing
        U+FFFD, as ``push`` holds them)."""
        if self.read == len(self.ids):
            return ""
        new = self.tokenizer.decode(self.ids[self.prefix :])[len(self._read_text) :]
        still_open = ends_open(self.tokenizer, self.ids[self.prefix :])
        if still_open is None:
            new = new.rstrip(INCOMPLETE)
        elif still_open and new.endswith(INCOMPLETE):
            new = new[:-1]
        self.prefix = self.read = len(self.ids)
        self._read_text = ""
        return new

    def _window_start(self, at: int) -> int:
        """Where the next window starts: ``at`` (the old ``read``), unless ids[at:] so far are special tokens
        ``decode`` leaves out; then the current start is kept (up to MAX_PENDING tokens back). A window whose
        read part holds no real token makes the next real token the first one decoded in the window but not
        in the read part, and a SentencePiece decoder strips only that one's leading space ("x<tool>y"
        streamed as "xy" where the whole decode is "x y")."""
        left_out = self.tokenizer.left_out
        if at - self.prefix < MAX_PENDING and all(left_out(t) for t in self.ids[at:]):
            return self.prefix
        return at


def ends_open(tokenizer, ids: list[int]) -> bool | None:
    """Whether the bytes ``decode`` writes for ``ids`` end inside a character later bytes can still complete (a
    lead byte with fewer continuation bytes than it announces): only such a U+FFFD is held back. A U+FFFD for
    bytes no later byte can make valid (a lone continuation byte, 0xFF) or one the model wrote whole (EF BF BD)
    is text. A token whose bytes are unknown (``token_bytes`` None: a ``ByteTokenizer`` id past the bytes, an
    added token) writes whole text, which closes whatever bytes came before it; None where it is the last."""
    tail: list[bytes] | None = []  # the bytes after the last token of unknown bytes
    for t in ids:
        if not tokenizer.left_out(t):
            b = tokenizer.token_bytes(t)
            if b is None:
                tail = None
            elif tail is None:
                tail = [b]
            else:
                tail.append(b)
    if tail is None:
        return None
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(b"".join(tail), final=False)
    return decoder.getstate()[0] != b""
