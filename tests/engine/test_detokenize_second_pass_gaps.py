"""Second-pass gap in ``detokenize.IncrementalDecoder``: a special token (left out of the decode) between two
real tokens of a SentencePiece-style tokenizer, which strips the leading space of the first piece decoded."""

from __future__ import annotations

from nonstop.engine.detokenize import IncrementalDecoder

PIECES = {1: "x", 2: "\u2581y", 4: "\u2581z"}
SPECIAL = {3: "<tool>"}


class SentencePieceLike:
    """decode: the pieces with U+2581 as a space, special tokens left out, one leading space stripped (as
    SentencePiece's decoder strips the first token's)."""

    def decode(self, ids):
        text = "".join(PIECES[i] for i in ids if i not in SPECIAL).replace("\u2581", " ")
        return text[1:] if text.startswith(" ") else text

    def special_name(self, token_id):
        return SPECIAL.get(token_id)

    def left_out(self, token_id):
        return token_id in SPECIAL


def _stream(ids):
    dec = IncrementalDecoder(SentencePieceLike())
    return "".join(dec.push(i) for i in ids)


def test_special_token_between_words_keeps_the_space():
    """x <tool> ▁y streams "x y", as the whole decode shows it: the window must keep starting before the special
    token, or the next word becomes the first piece of a window and loses its space ("xy")."""
    tok = SentencePieceLike()
    for ids in ([1, 3, 2], [1, 3, 3, 2], [1, 3, 2, 3, 4]):
        assert _stream(ids) == tok.decode(ids), ids


def test_incomplete_bytes_are_emitted_after_max_pending_tokens():
    """Bytes that never complete a character are held for at most MAX_PENDING tokens, then emitted (as U+FFFD):
    the MAX_PENDING-th pending token releases them."""
    from nonstop.engine.detokenize import MAX_PENDING
    from nonstop.engine.tokenizer import ByteTokenizer

    dec = IncrementalDecoder(ByteTokenizer(256))
    out = [dec.push(0xE2) for _ in range(MAX_PENDING)]
    assert out[:-1] == [""] * (MAX_PENDING - 1)
    assert out[-1] == "\ufffd" * MAX_PENDING
