"""StopStrings gaps found by a mutation audit: empty stop strings are dropped (not matched, no crash), and
the match reported among several stop strings is the one that completes first, ties broken by the
least start. Expected values come from a brute-force scan written here, not from the matcher."""

from __future__ import annotations

import random

from nonstop.engine.stop_strings import StopStrings


def _first_stop(text: str, stops: list[str]) -> int | None:
    """Character at a time: the first end position where some stop string completes; among the stop
    strings completing there, the least start."""
    for end in range(1, len(text) + 1):
        starts = [end - len(s) for s in stops if s and text[max(0, end - len(s)) : end] == s and end >= len(s)]
        if starts:
            return min(starts)
    return None


def test_an_empty_stop_string_is_dropped_and_the_others_still_match():
    # kills: `[s for s in stops if s]` -> `[s for s in stops]` (IndexError on s[0] of "")
    ss = StopStrings(["", "ab", ""])
    assert ss.stops == ["ab"]
    assert ss.feed("x") is None
    assert ss.feed("ab") == 1
    assert StopStrings([""]).feed("anything") is None
    assert StopStrings(["", ""]).held == 0


def test_the_stop_that_completes_first_wins_over_an_earlier_starting_one():
    # "bcd" starts before "cd"... both end together; "abcde" vs "bc": "bc" completes first at 3
    assert StopStrings(["abcde", "bc"]).feed("xabcdef") == 2
    # the same end: the least start wins ("abc" over "bc")
    assert StopStrings(["bc", "abc"]).feed("xabc") == 1
    # a list order does not matter
    assert StopStrings(["c", "abcd"]).feed("abcd") == 2


def test_positions_count_every_piece_fed_before():
    ss = StopStrings(["zz"])
    for piece in ["ab", "c", "", "dz"]:
        assert ss.feed(piece) is None
    assert ss.feed("z") == 4
    assert ss.held == 0 or ss.held <= 1


def test_random_pieces_match_the_brute_force_scan_and_held_is_the_longest_proper_prefix_end():
    rng = random.Random(7)
    for trial in range(3000):
        alpha = "ab" if trial % 2 else "abc"
        text = "".join(rng.choice(alpha) for _ in range(rng.randint(0, 12)))
        stops = ["".join(rng.choice(alpha) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        ss, pos, got = StopStrings(stops), 0, None
        while pos < len(text) and got is None:
            k = rng.randint(1, 4)
            got = ss.feed(text[pos : pos + k])
            pos += k
            if got is None:
                seen = text[:pos]
                want = max(
                    (k2 for s in stops for k2 in range(len(s)) if k2 <= len(seen) and seen[len(seen) - k2 :] == s[:k2]),
                    default=0,
                )
                assert ss.held == want, (text, stops, seen)
        assert got == _first_stop(text, stops), (text, stops)
