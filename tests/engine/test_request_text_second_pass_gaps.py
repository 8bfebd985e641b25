"""Second-pass gaps in the request's text path: stop strings (``stop_strings.StopStrings``) checked against a
brute-force search over random texts and random splits, the streamed pieces of a ``Request`` against its final
text, and the token sets its penalties read (``Request.penalty_ids``)."""

from __future__ import annotations

import random

import torch

from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams, apply_penalties
from nonstop.engine.stop_strings import StopStrings
from nonstop.engine.tokenizer import ByteTokenizer


def _first_stop(text: str, stops: list[str]) -> int | None:
    """Brute force: the start of the stop string whose first occurrence ends earliest (least start on a tie)."""
    best = None
    for s in stops:
        at = text.find(s)
        if at >= 0:
            key = (at + len(s), at)
            best = key if best is None else min(best, key)
    return None if best is None else best[1]


def _feed_split(stops: list[str], text: str, rng: random.Random) -> int | None:
    """Feed ``text`` in random pieces until a stop string is reported; its start in the whole text."""
    ss = StopStrings(stops)
    i = 0
    while i < len(text):
        j = min(len(text), i + rng.randint(1, 4))
        at = ss.feed(text[i:j])
        if at is not None:
            return at
        i = j
    return None


def test_stop_strings_match_brute_force():
    """Where the first stop string starts, for random texts over a two-letter alphabet (many overlapping partial
    matches: the KMP fallback chain is exercised) and random splits, equals a plain ``str.find`` search. Catches
    a prefix function or a fallback that stops after one step, an off-by-one start, and the choice of the
    match that completes last instead of first."""
    rng = random.Random(1234)
    for _ in range(400):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(2, 7))) for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choice("ab") for _ in range(rng.randint(1, 30)))
        assert _feed_split(stops, text, rng) == _first_stop(text, stops), (stops, text)


def test_stop_string_completing_first_wins_within_one_piece():
    """Two stop strings completing inside one piece: the one that ends first cuts the text (as if the text had
    come a character at a time), not the one that ends later."""
    ss = StopStrings(["ab", "cd"])
    assert ss.feed("xcdab") == 1
    ss = StopStrings(["ab", "cd"])
    assert ss.feed("q") is None
    assert ss.feed("xabcd") == 2


def test_held_is_longest_prefix_over_all_stop_strings():
    """``held`` is the longest text end that could still become any stop string (the max over them)."""
    ss = StopStrings(["xyz", "abcd"])
    assert ss.feed("..abc") is None
    assert ss.held == 3
    ss = StopStrings(["abcd", "cq"])
    ss.feed("zabc")
    assert ss.held == 3


def _run(tokens: list[int], params: SamplingParams, eos=frozenset()):
    req = Request("r", None, [1, 2], params, eos)
    tok = ByteTokenizer(256)
    pieces = [req.append(t, tok) for t in tokens]
    return req, pieces


def test_stream_releases_held_text_when_length_ends():
    """A tail held back as a possible stop-string start is streamed when the request ends by length: the
    streamed pieces add up to the final text."""
    req, pieces = _run([ord(c) for c in "hello ab"], SamplingParams(max_tokens=8, stop=["abc"]))
    assert req.finish_reason == "length"
    assert req.text == "hello ab"
    assert "".join(pieces) == "hello ab"


def test_stream_never_sends_the_stop_string():
    """The stop string and what follows are cut from both the final text and the stream."""
    req, pieces = _run([ord(c) for c in "hi STOP"], SamplingParams(max_tokens=20, stop=["STOP"]))
    assert req.finish_reason == "stop"
    assert req.text == "hi "
    assert "".join(pieces) == "hi "


def test_penalty_ids_hold_every_prompt_and_output_token():
    """The repetition penalty applies to every prompt token (the first included) and to output tokens."""
    req = Request("r", None, [7, 3, 7], SamplingParams(repetition_penalty=2.0), frozenset())
    tok = ByteTokenizer(256)
    req.append(11, tok)
    req.append(11, tok)
    seen, out, counts = req.penalty_ids()
    assert sorted(seen.tolist()) == [3, 7, 11]
    assert out.tolist() == [11]
    assert counts.tolist() == [2.0]


def test_penalties_by_hand():
    """repetition r=2 on prompt + output tokens (l/r if l > 0 else l·r), presence a=0.5 once per output token,
    frequency f=0.25 per occurrence, computed by hand."""
    req = Request(
        "r",
        None,
        [0, 1],
        SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25),
        frozenset(),
    )
    tok = ByteTokenizer(256)
    for t in (2, 2, 2):
        req.append(t, tok)
    logits = torch.tensor([4.0, -1.0, 3.0, 1.0])
    got = apply_penalties(logits, req.params, req).tolist()
    # token 0: 4/2; token 1: -1*2; token 2: 3/2 - 0.5 - 0.25*3; token 3 untouched
    assert got == [2.0, -2.0, 1.5 - 0.5 - 0.75, 1.0]
    only_presence = SamplingParams(presence_penalty=0.5)
    assert only_presence.penalized
    req2 = Request("r", None, [0], only_presence, frozenset())
    req2.append(2, tok)
    req2.append(2, tok)
    assert apply_penalties(logits, only_presence, req2).tolist() == [4.0, -1.0, 2.5, 1.0]
    only_frequency = SamplingParams(frequency_penalty=0.5)
    req3 = Request("r", None, [0], only_frequency, frozenset())
    req3.append(2, tok)
    req3.append(2, tok)
    assert apply_penalties(logits, only_frequency, req3).tolist() == [4.0, -1.0, 2.0, 1.0]


def test_seeded_request_generator_uses_its_seed():
    """A sampled request's own RNG (the speculative verifier's acceptance draws) is seeded with the request's
    seed: completions of different seeds must not share their acceptance randomness."""
    a = Request("a", None, [1], SamplingParams(temperature=1.0, seed=5), frozenset())
    b = Request("b", None, [1], SamplingParams(temperature=1.0, seed=6), frozenset())
    assert a.generator.initial_seed() == 5
    assert b.generator.initial_seed() == 6
    ref = torch.Generator().manual_seed(6)
    assert torch.equal(torch.rand(4, generator=b.generator), torch.rand(4, generator=ref))
    assert Request("g", None, [1], SamplingParams(temperature=0), frozenset()).generator is None
