"""Defect a black-box probe of ``LLM.generate`` found (these tests fail on the code as it is): a request's
final ``text`` drops bytes that can never form a character when they come last.

``engine/detokenize.py`` promises that the streamed pieces add up to ``tokenizer.decode(ids)`` "minus a
trailing incomplete character (held back, as the whole-sequence decode would show it as U+FFFD)".
``IncrementalDecoder`` holds back any window whose decode ends in U+FFFD, and nothing flushes it when the
request ends, so invalid bytes - a lone continuation byte (0x80-0xBF), or 0xFF, which no UTF-8 character
holds - are lost as well when they end the output: a completion whose ids decode to "ok\\ufffd" (as
``tokenizer.decode`` and transformers show them) has text "ok". A sampled output of any byte-level
tokenizer (k3-nano's included: its token 122 is the byte 0xBB) can end that way.

The expected text comes from Python's own incremental UTF-8 decoder (``errors="replace"``, not final): it
shows every invalid byte as U+FFFD at once and keeps only a truly incomplete tail back - exactly the
documented "decode minus a trailing incomplete character"."""

from __future__ import annotations

import codecs

import pytest

from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import ByteTokenizer, Tokenizer
from nonstop.weights.resolve import ASSETS

K3 = ASSETS / "k3-nano"


def _documented_text(data: bytes) -> str:
    """``data`` decoded with a trailing incomplete character left out (and nothing else)."""
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)


def _run(tok, generated: list[int], eos: int | None = None) -> Request:
    ends = frozenset() if eos is None else frozenset({eos})
    out = generated if eos is None else [*generated, eos]
    max_tokens = len(generated) if eos is None else 50
    req = Request("r", None, [1], SamplingParams(temperature=0, max_tokens=max_tokens), ends)
    pieces = [req.append(t, tok) for t in out]
    assert req.finished and "".join(pieces) == req.text
    return req


@pytest.mark.parametrize(
    "data",
    [b"ok\xbb", b"ok\xff", b"ok\xbb\xbb\xbb", b"ok\xbb\xe4"],
    ids=["continuation", "ff", "three-continuations", "invalid-then-incomplete"],
)
@pytest.mark.parametrize("end", ["length", "eos"])
def test_invalid_bytes_that_end_an_output_stay_in_its_text(data, end):
    """Defect: byte tokenizer, output ``ok`` + invalid bytes, ended by max_tokens or by EOS (id 0, outside
    the bytes generated): the text must show each invalid byte as U+FFFD ("ok\\ufffd" for ``ok\\xbb``), as
    ``bytes.decode(errors="replace")`` does; only a trailing incomplete character (0xE4 waiting for its
    continuation bytes) may be left out. The code drops them all: "ok"."""
    tok = ByteTokenizer(256)
    req = _run(tok, list(data), eos=0 if end == "eos" else None)
    want = _documented_text(data)
    assert want.startswith("ok\ufffd")
    assert req.text == want


def test_an_incomplete_last_character_is_still_held_back():
    """Control (passes today): ``ok`` + 0xE4 (the first byte of a 3-byte character) at max_tokens leaves
    the text "ok", as documented; the fix for the defect above must not show this one as U+FFFD."""
    req = _run(ByteTokenizer(256), list(b"ok\xe4"))
    assert req.text == _documented_text(b"ok\xe4") == "ok"


def test_k3_nano_output_ending_in_a_lone_continuation_byte_keeps_it_as_transformers_shows_it():
    """Defect, with the bundled model's own BPE tokenizer: "ok" then the byte-level token for 0xBB (a lone
    continuation byte, which no later token can complete into a character) at max_tokens. transformers'
    decode of the ids (the oracle) is "ok\\ufffd"; the request's text is "ok"."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(K3))
    tok = Tokenizer.load(K3, 6144)
    ids = [*hf.encode("ok", add_special_tokens=False), hf.convert_tokens_to_ids("\u00bb")]  # byte 0xBB
    want = hf.decode(ids, skip_special_tokens=True)
    assert want == "ok\ufffd"
    assert _run(tok, ids).text == want
