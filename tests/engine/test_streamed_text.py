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


def _first_stop_and_held(text: str, stops: list[str]) -> tuple[int | None, int]:
    """By brute force: the least start of a stop string in ``text`` and the longest end of ``text`` that
    is a proper prefix of a stop string."""
    starts = [text.find(s) for s in stops if s in text]
    held = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
    return (min(starts) if starts else None), held


@pytest.mark.parametrize("seed", range(40))
def test_stop_strings_match_a_brute_force_search_over_random_pieces(seed):
    """Small alphabets make overlapping, self-similar stop strings (aab, abab, ...) and split matches."""
    import random

    from nonstop.engine.stop_strings import StopStrings

    rng = random.Random(seed)
    alphabet = "ab" if seed % 2 else "abé"
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(rng.randint(1, 4))]
    matcher, text = StopStrings(stops), ""
    for _ in range(30):
        new = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4)))
        text += new
        start, held = _first_stop_and_held(text, stops)
        assert matcher.feed(new) == start, (stops, text)
        if start is not None:
            break
        assert matcher.held == held, (stops, text)


def test_a_long_stop_string_is_matched_and_held_across_many_pieces():
    stop = "z" * 5000 + "!"
    pieces, req = _stream("a" + "z" * 6000 + "!b", stop=stop)
    assert req.text == "a" + "z" * 1000 and req.finish_reason == "stop"
    assert "".join(pieces) == req.text
