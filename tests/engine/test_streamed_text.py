"""Request.append: the streamed pieces always add up to the final text (stop strings held back)."""

from __future__ import annotations

import pytest

from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import ByteTokenizer


def _stream(text: str, **params):
    tok = ByteTokenizer(256)
    req = Request("r", None, [1], SamplingParams(temperature=0, max_tokens=len(text.encode()), **params), frozenset())
    pieces = []
    for b in text.encode():
        pieces.append(req.append(b, tok))
        if req.finished:
            break
    return pieces, req


@pytest.mark.parametrize(
    "text, stop, expected_text, reason",
    [
        ("xabdabc tail", "abc", "xabd", "stop"),
        ("aaab!", "ab", "aa", "stop"),
        ("no stop here", "zz", "no stop here", "length"),
        ("ends with a", "ab", "ends with a", "length"),
        ("one two three", ["two", "one t"], "", "stop"),
        ("héllo wörld", "wö", "héllo ", "stop"),
    ],
)
def test_pieces_add_up_to_the_text(text, stop, expected_text, reason):
    pieces, req = _stream(text, stop=stop)
    assert "".join(pieces) == req.text == expected_text
    assert req.finish_reason == reason


def test_text_is_not_held_back_without_stop_strings():
    pieces, req = _stream("abc")
    assert pieces == ["a", "b", "c"]


def test_a_possible_stop_prefix_is_released_once_it_is_not_one():
    pieces, _ = _stream("xaby", stop="abc")
    assert pieces == ["x", "", "", "aby"]
