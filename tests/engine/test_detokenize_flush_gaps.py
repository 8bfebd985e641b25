"""What a request's text keeps when it ends (``IncrementalDecoder.flush`` at the last token) and what
``TiktokenTokenizer`` says about the bytes ``decode`` writes (``left_out``, ``token_bytes``, ``decode``).

Expected texts come from Python's own incremental UTF-8 decoder (``errors="replace"``, not final: every
invalid byte is U+FFFD at once, only a truly incomplete last character is left out) or from the tiktoken
fixture's names written by hand."""

from __future__ import annotations

import pytest

from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import ByteTokenizer, Tokenizer
from tests.engine.test_final_text_invalid_bytes_defects_gaps import _documented_text as _python_text
from tests.engine.test_final_text_invalid_bytes_defects_gaps import _run as _finish
from tests.engine.test_kimi_tiktoken_differential_gaps import BASE, _ranks, _write

THINK = BASE + 11
IM_END = BASE + 2


@pytest.mark.parametrize("end", ["length", "eos"])
def test_a_character_cut_by_a_new_lead_byte_is_flushed_at_the_end(end):
    """Catches a flush that returns nothing or drops its first character, or one called only at EOS, only
    at max_tokens or one token late: ``ok`` + E4 B8 (a 3-byte character cut short) + E4 (a new lead byte).
    Every push after ``ok`` is held (the bytes end open), so only the flush at the last token shows the
    cut character as U+FFFD; the open E4 stays out: "ok\\ufffd"."""
    data = b"ok\xe4\xb8\xe4"
    req = _finish(ByteTokenizer(256), list(data), eos=0 if end == "eos" else None)
    assert _python_text(data) == "ok\ufffd"
    assert req.text == "ok\ufffd"


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    """The tiktoken fixture with a model vocabulary 8 ids past the tokenizer's special block."""
    return Tokenizer.load(_write(tmp_path_factory.mktemp("kimi")), BASE + 258 + 8)


def test_an_invalid_byte_after_a_kept_special_token_stays_in_the_text(kimi):
    """Catches ``token_bytes`` unknown (None) for special tokens decode writes: ``<think>`` then the lone
    continuation byte 0xBB at max_tokens must end "<think>\\ufffd" (decode's text); with the name's bytes
    unknown every trailing U+FFFD is held and the flush drops it."""
    ids = [THINK, 0xBB]
    assert kimi.decode(ids) == "<think>\ufffd"
    assert _finish(kimi, ids).text == "<think>\ufffd"


def test_an_invalid_byte_after_an_id_past_the_tokenizer_stays_in_the_text(kimi):
    """Catches ``left_out`` missing ids the tokenizer does not know (a model vocabulary padded past it):
    such an id writes nothing, so 0xBB after it is U+FFFD at once and at the end of the output."""
    unknown = BASE + 258 + 3
    assert kimi.left_out(unknown)
    assert _finish(kimi, [unknown, 0xBB]).text == "\ufffd"


def test_a_kept_special_token_closes_the_character_before_it(kimi):
    """Catches ``left_out`` answering True for every special id: E4, ``<think>``, BB decode to
    "\\ufffd<think>\\ufffd" (the name's bytes end the E4); read without the name, E4 BB looks open and the
    last U+FFFD is held and then dropped at the end."""
    ids = [0xE4, THINK, 0xBB]
    assert kimi.decode(ids) == "\ufffd<think>\ufffd"
    assert _finish(kimi, ids).text == "\ufffd<think>\ufffd"


def test_decode_keeps_token_zero_and_leaves_out_unknown_ids(kimi):
    """Catches ``_known`` refusing id 0 (the byte 0x00 is a real token) and decode passing ids past the
    special block to tiktoken (which has no text for them)."""
    the = _ranks()[b"the"]
    assert kimi.decode([0, ord("a")]) == "\x00a"
    assert kimi.decode([the, BASE + 258, BASE + 265, the]) == "thethe"


@pytest.mark.parametrize(
    "extra, skipped, kept",
    [
        ({"additional_special_tokens": ["<think>"]}, THINK, IM_END),
        ({"extra_special_tokens": ["<think>"]}, THINK, IM_END),
        ({"additional_special_tokens": []}, IM_END, THINK),
    ],
    ids=["additional", "extra-transformers5", "empty-list-means-default"],
)
def test_a_configured_special_token_list_replaces_the_default(tmp_path, extra, skipped, kept):
    """Catches the config's own list (``additional_special_tokens``, or transformers 5's
    ``extra_special_tokens``) being ignored for the class default, and an empty list read as "skip none":
    the listed tokens alone are left out of decode (an empty list falls back to the 8 chat markers, as the
    published class does)."""
    tok = Tokenizer.load(_write(tmp_path / "k", extra), BASE + 258)
    the = _ranks()[b"the"]
    names = {THINK: "<think>", IM_END: "<|im_end|>"}
    assert tok.decode([skipped, the, kept]) == "the" + names[kept]
    assert tok.left_out(skipped) and not tok.left_out(kept)


@pytest.mark.parametrize("end", ["length", "eos"])
def test_an_invalid_byte_after_a_token_of_unknown_bytes_keeps_its_replacement(end):
    """A ``ByteTokenizer`` id past the bytes (its bytes unknown: it writes "<|300|>") then 0xBB, a byte that can
    never be valid, ending the output: the text is the whole decode, "<|300|>\\ufffd". The token of unknown bytes
    made the whole window "unknown", so the U+FFFD was held as if a character were in progress and stripped at
    the end. A trailing 0xE4 (a character in progress) is still left out."""
    tok = ByteTokenizer(512)
    eos = 511
    for tail, want in ((0xBB, "<|300|>\ufffd"), (0xE4, "<|300|>")):
        ids = [300, tail] + ([eos] if end == "eos" else [])
        req = Request("r", None, [1], SamplingParams(temperature=0, max_tokens=2 if end == "length" else 9), {eos})
        pieces = [req.append(t, tok) for t in ids]
        assert req.finished and req.text == want and "".join(pieces) == want, (tail, req.text)
