"""``nonstop generate``'s metrics line (``_timing``): how compile time of the cpu backend is split between the
time to first token and the decode speed, and the fallbacks when a speed cannot be given. Expected strings
are hand-computed from the metrics given."""

from __future__ import annotations

from nonstop.commands.generate import _timing


def _metrics(**over) -> dict:
    m = {
        "generated_tokens": 5,
        "prompt_tokens": 3,
        "time_to_first_token_s": 0.25,
        "decode_tokens_per_s": 2.0,
        "decode_time_s": 2.0,
    }
    return {**m, **over}


def test_compiling_is_split_between_first_token_and_decode():
    """1.5 s compiled, 1.0 s of it inside the decode interval: 0.5 s goes with the first token, 1.0 s with the
    decode speed, whose rate without it is 4 steps / (2.0 - 1.0) s = 4.0 tokens/s."""
    line = _timing(_metrics(decode_compiling_s=1.0), 1.5, None)
    assert line == (
        "5 tokens, prompt 3 tokens, first token 250 ms (incl. 0.5 s compiling the step, cached for later runs), "
        "decode 2.0 tokens/s (incl. 1.0 s compiling, also cached; 4.0 tokens/s without it)"
    )


def test_the_decode_share_never_exceeds_what_was_compiled():
    """decode_compiling_s 3.0 but only 1.0 s compiled during this request: 1.0 s is charged to decode (none to
    the first token), rate without it 4 / (2.0 - 1.0) = 4.0."""
    line = _timing(_metrics(decode_compiling_s=3.0), 1.0, None)
    assert "first token 250 ms, " in line
    assert "decode 2.0 tokens/s (incl. 1.0 s compiling, cached for later runs; 4.0 tokens/s without it)" in line


def test_small_compile_times_are_still_reported():
    """0.06 s (over the 0.05 s threshold) before the first token and 0.06 s in decode are both said."""
    line = _timing(_metrics(decode_compiling_s=0.06), 0.12, None)
    assert "(incl. 0.1 s compiling the step, cached for later runs)" in line
    assert "(incl. 0.1 s compiling, also cached; " in line
    quiet = _timing(_metrics(decode_compiling_s=0.04), 0.08, None)
    assert "compiling" not in quiet


def test_speed_fallbacks():
    """No decode speed (one token): 'n/a tokens/s' and no compile note; a decode interval all compiling:
    'n/a without it' (not a division by zero or a negative rate)."""
    one = _timing(_metrics(generated_tokens=1, decode_tokens_per_s=None, decode_time_s=0.0), 0.0, None)
    assert one.endswith("decode n/a tokens/s")
    charged = _metrics(generated_tokens=1, decode_tokens_per_s=None, decode_time_s=0.0, decode_compiling_s=1.0)
    assert _timing(charged, 1.0, None).endswith("decode n/a tokens/s")  # no rate to qualify
    all_compiling = _timing(_metrics(decode_compiling_s=2.0), 2.0, None)
    assert "(incl. 2.0 s compiling, cached for later runs; n/a without it)" in all_compiling


def test_speculative_drafts_are_reported():
    """With verification steps the line ends with accepted/drafted and the mean accepted length."""
    m = _metrics(verify_steps=2, accepted_tokens=3, drafted_tokens=4, mean_accepted_length=2.5)
    assert _timing(m, 0.0, "ngram").endswith("decode 2.0 tokens/s, ngram drafts: 3/4 accepted, 2.50 tokens/step")
    assert "drafts" not in _timing(_metrics(), 0.0, None)


def test_a_step_loaded_from_the_cache_is_said_as_loading_not_compiling():
    """A warm run spent its seconds tracing and loading: the line says so, and never "cached for later runs"
    (which told users of every run that the cache had not worked). Split as for a compile."""
    line = _timing(_metrics(decode_compiling_s=1.0), 1.5, None, from_cache=True)
    assert "first token 250 ms (incl. 0.5 s loading the compiled step from the cache)" in line
    assert "decode 2.0 tokens/s (incl. 1.0 s loading the compiled step; 4.0 tokens/s without it)" in line
    assert "compiling" not in line and "cached" not in line.replace("from the cache", "")
