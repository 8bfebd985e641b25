"""Incremental detokenisation: streamed text equals decoding everything again at every token (the
simple rule it replaces), including multi-byte characters split across tokens, and each token costs
a bounded number of decoded ids whatever the output length."""

from __future__ import annotations

import codecs
import random

import pytest

from nonstop.engine.detokenize import IncrementalDecoder
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import ByteTokenizer, Tokenizer
from nonstop.weights.resolve import ASSETS

TEXT = "Grüße, 世界! naïve café — 🙂 emoji, ĳ ligature; plain ascii words follow. Ωμέγα ∑ ≤ ≥ "


def _k3_nano_tokenizer() -> Tokenizer:
    return Tokenizer.load(ASSETS / "k3-nano", 6144)


def _tokenizers() -> dict[str, Tokenizer]:
    return {"bytes": ByteTokenizer(300), "k3-nano BPE": _k3_nano_tokenizer()}


class CountingTokenizer:
    """Wraps a tokenizer and counts the ids passed to ``decode``."""

    def __init__(self, inner):
        self.inner, self.decoded, self.calls, self.largest = inner, 0, 0, 0

    def decode(self, ids):
        self.decoded += len(ids)
        self.calls += 1
        self.largest = max(self.largest, len(ids))
        return self.inner.decode(ids)

    def __getattr__(self, name):  # everything else (special_name) from the wrapped tokenizer
        return getattr(self.inner, name)


def _open(tok, ids: list[int]) -> bool:
    """Whether the ids' bytes end in a character later bytes can still complete: Python's incremental UTF-8
    decoder (errors="replace", not final) keeps bytes pending."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    kept = [i for i in ids if not tok.left_out(i)]  # special tokens decode leaves out write no bytes
    decoder.decode(b"".join(tok.token_bytes(i) for i in kept), final=False)
    return decoder.getstate()[0] != b""


def _reference_stream(ids: list[int], tok, stops: list[str], eos: int | None = None):
    """The rule before incremental decoding: decode every visible id again after each token, unless the bytes
    end in a character still open (``_open``); at the last token the whole decode less that open character
    (bytes that can never be valid are text, U+FFFD, as Python's decoder shows them); hold back a text end
    that may start a stop string; stop at the first stop string."""
    text, sent, pieces = "", 0, []
    for n in range(1, len(ids) + 1):
        ends = ids[n - 1] == eos
        seen = ids[: n - 1] if ends else ids[:n]
        if ends or n == len(ids):
            full = tok.decode(seen)
            text = full[:-1] if _open(tok, seen) else full
        elif not _open(tok, seen):
            text = tok.decode(seen)
        hits = [at for at in (text.find(s) for s in stops) if at >= 0]
        done = bool(hits) or ends or n == len(ids)
        if hits:
            text = text[: min(hits)]
        end = len(text) if done else len(text) - _held(text, stops)
        pieces.append(text[sent:end])
        sent = max(sent, end)
        if done:
            break
    return pieces, text


def _held(text: str, stops: list[str]) -> int:
    """The longest end of ``text`` that is a proper prefix of a stop string (brute force)."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def _stream(ids: list[int], tok, stops: list[str], eos: int | None = None):
    params = SamplingParams(temperature=0, max_tokens=len(ids), stop=stops or None)
    req = Request("r", None, [1], params, frozenset([eos] if eos is not None else []))
    pieces = []
    for t in ids:
        pieces.append(req.append(t, tok))
        if req.finished:
            break
    return pieces, req.text


@pytest.mark.parametrize("name", ["bytes", "k3-nano BPE"])
def test_pieces_equal_the_whole_decode_on_multibyte_text(name):
    tok = _tokenizers()[name]
    ids = tok.encode(TEXT * 3)
    dec = IncrementalDecoder(tok)
    pieces = [dec.push(t) for t in ids]
    assert "".join(pieces) == tok.decode(ids) == TEXT * 3
    if name == "bytes":  # every multi-byte character arrives in pieces: nothing is shown half-done
        assert all("\ufffd" not in p for p in pieces) and "" in pieces


@pytest.mark.parametrize("name", ["bytes", "k3-nano BPE"])
def test_requests_stream_exactly_what_the_whole_decode_rule_streams(name):
    """Random token streams (random ids, so also invalid UTF-8 and cut characters), random stop strings
    taken from the text itself, an end token: same pieces, same final text as the old rule."""
    tok = _tokenizers()[name]
    rng = random.Random(7)
    base = tok.encode(TEXT * 4)
    for trial in range(60):
        if trial % 3 == 0:
            ids = [rng.randrange(0, 256) for _ in range(rng.randrange(1, 60))]
        else:
            start = rng.randrange(0, len(base) - 5)
            ids = base[start : start + rng.randrange(1, 60)]
        whole = tok.decode(ids)
        stops = []
        for _ in range(rng.randrange(0, 3)):
            if len(whole) > 2:
                a = rng.randrange(0, len(whole) - 1)
                stops.append(whole[a : a + rng.randrange(1, 5)])
        stops = [s for s in stops if s and "\ufffd" not in s]
        eos = ids[rng.randrange(len(ids))] if trial % 4 == 1 else None
        want = _reference_stream(ids, tok, stops, eos)
        got = _stream(ids, tok, stops, eos)
        assert got == want, (trial, ids, stops, eos)


def test_a_character_split_across_tokens_appears_once_complete():
    tok = ByteTokenizer(256)
    dec = IncrementalDecoder(tok)
    emoji = "🙂".encode()  # 4 bytes
    assert [dec.push(b) for b in b"a" + emoji + b"b"] == ["a", "", "", "", "🙂", "b"]


def test_a_replacement_character_written_whole_is_not_held_back():
    """EF BF BD is U+FFFD itself, complete: it was held back as an incomplete character (and lost when it
    ended the output). A lead byte (E4) that the next byte (EF) leaves unfinished is a U+FFFD of its own, shown
    once the U+FFFD after it is complete, as Python's incremental decoder shows the bytes."""
    tok = ByteTokenizer(256)
    dec = IncrementalDecoder(tok)
    assert [dec.push(b) for b in b"a\xef\xbf\xbdb"] == ["a", "", "", "\ufffd", "b"]
    dec = IncrementalDecoder(tok)
    assert (
        "".join(dec.push(b) for b in b"a\xe4\xef\xbf\xbd")
        == "a\ufffd\ufffd"
        == b"a\xe4\xef\xbf\xbd".decode(errors="replace")
    )


@pytest.mark.parametrize("name", ["bytes", "k3-nano BPE"])
def test_cost_per_token_does_not_grow_with_the_output(name):
    """Ids decoded per token: the same bound for a 100-token and a 2000-token output (the old rule
    decoded the whole output each time: ~1000 ids per token at 2000 tokens)."""
    tok = _tokenizers()[name]
    ids = tok.encode(TEXT * 60)
    assert len(ids) >= 2000
    per_token = {}
    for n in (100, 2000):
        counting = CountingTokenizer(tok)
        params = SamplingParams(temperature=0, max_tokens=n, stop=["never-in-the-text"])
        req = Request("r", None, [1], params, frozenset())
        for t in ids[:n]:
            req.append(t, counting)
        assert req.text == _reference_stream(ids[:n], tok, [])[1]
        per_token[n] = counting.decoded / n
        assert counting.largest <= 12, counting.largest  # a window spans a few tokens
        assert counting.calls <= 2 * n
    assert per_token[2000] <= per_token[100] * 1.5 + 0.5, per_token
