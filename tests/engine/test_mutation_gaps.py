"""Small checks of sampling, request and stop-string behaviour that a mutation audit found untested.

Every expected value comes from the definition (hand arithmetic or a brute force), not from the code.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from nonstop.engine.requests import Request
from nonstop.engine.sampling import REPETITION_PENALTY_RANGE, InvalidSamplingParam, SamplingParams, sample, top_logprobs
from nonstop.engine.stop_strings import StopStrings, prefix_function
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.model.sampling import filter_logits, penalize


class _History:
    """What ``sample`` reads for penalties: token 0 generated once, nothing else seen."""

    def penalty_ids(self):
        return torch.tensor([0]), torch.tensor([0]), torch.tensor([1.0])


@pytest.mark.parametrize("params", [{"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"repetition_penalty": 2.0}])
def test_each_penalty_alone_marks_the_params_penalized(params):
    assert SamplingParams(**params).penalized is True
    assert SamplingParams().penalized is False


def test_greedy_frequency_penalty_moves_off_a_repeated_token():
    logits = torch.tensor([1.0, 0.5, 0.0])  # token 0 leads; 1.0 - 2 * 1 = -1 puts it below token 1
    params = SamplingParams(temperature=0, frequency_penalty=2.0)
    assert sample(logits, params, None, _History()) == 1
    assert sample(logits, SamplingParams(temperature=0), None, _History()) == 0


def _request(prompt, eos=(), fields=None, **params) -> Request:
    params = SamplingParams(temperature=0, **params)
    return Request("r", None, list(prompt), params, frozenset(eos), **(fields or {}))


def test_penalty_ids_hold_generated_ids_absent_from_the_prompt():
    req = _request([1, 2], max_tokens=8)
    tok = ByteTokenizer(256)
    for t in (5, 7, 5):
        req.append(t, tok)
    seen, out, counts = req.penalty_ids()
    assert seen.tolist() == [1, 2, 5, 7]
    assert dict(zip(out.tolist(), counts.tolist())) == {5: 2.0, 7: 1.0}


def _run(req: Request, tokens) -> int:
    tok = ByteTokenizer(256)
    for i, t in enumerate(tokens):
        req.append(t, tok)
        if req.finished:
            return i + 1
    return len(tokens)


def test_ignore_eos_runs_to_max_tokens():
    req = _request([1], eos=[9], max_tokens=3, ignore_eos=True)
    assert _run(req, [9, 9, 9, 9]) == 3
    assert req.finish_reason == "length"
    assert req.output_ids == [9, 9, 9]


def test_eos_stops_without_ignore_eos():
    req = _request([1], eos=[9], max_tokens=3)
    assert _run(req, [9, 9, 9]) == 1
    assert req.finish_reason == "stop"


def test_top_p_drops_a_token_whose_mass_above_is_exactly_top_p():
    # four equal logits: mass 0.25 each, exactly 0.5 above id 2, so ids 0 and 1 reach top_p = 0.5
    x = filter_logits(torch.zeros(4), 1.0, 0, 0.5)
    assert torch.isfinite(x).tolist() == [True, True, False, False]


def test_top_p_keeps_the_lowest_ids_on_ties():
    x = filter_logits(torch.zeros(64), 1.0, 0, 0.5)  # 32 tokens of 1/64 reach 0.5
    assert torch.nonzero(torch.isfinite(x))[:, 0].tolist() == list(range(32))


def _prefix_brute(s: str) -> list[int]:
    """Longest proper prefix of s[:i+1] that is also its end, by trying every length."""
    return [max(k for k in range(i + 1) if s[:k] == s[i + 1 - k : i + 1]) for i in range(len(s))]


def test_prefix_function_matches_its_definition_on_every_short_ab_string():
    for n in range(1, 11):
        for chars in itertools.product("ab", repeat=n):
            s = "".join(chars)
            assert list(prefix_function(s)) == _prefix_brute(s), s


def test_stop_string_not_in_the_text_never_matches():
    stops = StopStrings(["aaabb"])
    text = "aaabaabbaabab"
    assert "aaabb" not in text
    assert [stops.feed(c) for c in text] == [None] * len(text)


def _first_stop(text: str, stops: list[str]) -> tuple[int, int] | None:
    """(index of the character that first completes a stop string, least start of one ending there)."""
    for end in range(len(text)):
        starts = [end + 1 - len(s) for s in stops if text[: end + 1].endswith(s)]
        if starts:
            return end, min(starts)
    return None


def test_stop_strings_fed_per_character_match_the_brute_force():
    stops = ["aab", "abab", "bb", "abb"]
    for n in range(1, 9):
        for chars in itertools.product("ab", repeat=n):
            text = "".join(chars)
            matcher = StopStrings(stops)
            fed = [matcher.feed(c) for c in text]
            hits = [(i, v) for i, v in enumerate(fed) if v is not None]
            assert (hits[0] if hits else None) == _first_stop(text, stops), text


@pytest.mark.parametrize("stops", [["bc", "ab"], ["ab", "bc"]])
def test_earliest_stop_start_wins(stops):
    # feed returns where in the text the first stop string starts: "ab" at 0 comes before "bc" at 1
    assert StopStrings(stops).feed("abc") == 0


def test_smallest_repetition_penalty_keeps_logits_finite():
    r = REPETITION_PENALTY_RANGE[0]
    assert SamplingParams(repetition_penalty=r).penalized
    logits = torch.tensor([100.0, -100.0, 5.0])  # 100 / r is far beyond float32's largest
    out = penalize(logits, torch.tensor([0, 1]), torch.tensor([], dtype=torch.long), torch.tensor([]), r)
    assert torch.isfinite(out).all()
    assert out[0] == torch.finfo(torch.float32).max
    assert out[2] == 5.0


def test_seed_for_wraps_past_the_largest_seed():
    params = SamplingParams(seed=2**64 - 1, n=2)
    assert params.seed_for(0) % 2**64 == 2**64 - 1  # the same 64-bit seed (-1 and 2^64 - 1 alike)
    assert params.seed_for(1) == 0  # 2^64 as a 64-bit seed


def test_decode_tokens_per_s_counts_the_gaps_after_the_first_token():
    times = {"arrival": 9.0, "first_token_at": 10.0, "finished_at": 12.0}
    req = _request([1], max_tokens=8, fields={"output_ids": [3, 4, 5, 6, 7], **times})
    req.finish_reason = "length"
    m = req.output().metrics
    assert m["decode_time_s"] == 2.0
    assert m["decode_tokens_per_s"] == 2.0  # 4 tokens after the first, in 2 s


def test_min_p_one_is_accepted():
    assert SamplingParams(min_p=1.0).min_p == 1.0
    with pytest.raises(InvalidSamplingParam):
        SamplingParams(min_p=1.0001)


def test_top_logprobs_beyond_the_vocabulary_returns_every_token():
    logprobs = torch.log_softmax(torch.arange(8.0), dim=-1)
    got = top_logprobs(logprobs, 20, 3)
    assert sorted(got) == list(range(8))
    assert got[7] == pytest.approx(float(logprobs[7]))


def test_overlapping_stop_strings_cut_where_the_first_one_completes_however_the_text_is_split():
    """With stops "bc" and "abcd", the text "abcd" fed a character at a time ends at "bc" (cut at 1: "a"),
    but fed as one token the least start won ("abcd" at 0: ""). The cut depended on the tokenization; it is
    now where the first stop string completes, for every split of the text into pieces."""
    assert StopStrings(["bc", "abcd"]).feed("abcd") == 1
    stops = ["aab", "abab", "bb", "abb", "ba"]
    for n in range(1, 8):
        for chars in itertools.product("ab", repeat=n):
            text = "".join(chars)
            expected = _first_stop(text, stops)
            for cuts in itertools.product((False, True), repeat=n - 1):
                matcher, piece, got = StopStrings(stops), text[0], None
                for c, cut in zip(text[1:], cuts):
                    if cut:
                        got = matcher.feed(piece) if got is None else got
                        piece = ""
                    piece += c
                got = matcher.feed(piece) if got is None else got
                assert got == (expected[1] if expected else None), (text, cuts)
