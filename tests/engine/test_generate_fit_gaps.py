"""``nonstop generate``'s default max_tokens fitting (``_fit_default_max_tokens``) at its edges: a default that
exactly fits is left alone and silent, and a prompt that fills the context is left for ``LLM.check_length`` to
refuse with the context message (not cut to 0 tokens)."""

from __future__ import annotations

from nonstop.commands.generate import _fit_default_max_tokens
from nonstop.engine.sampling import SamplingParams


def test_a_default_that_exactly_fits_is_unchanged_and_not_reported(capsys):
    """room == max_tokens: nothing to cut, so no 'cut to' line on stderr."""
    params = SamplingParams(max_tokens=10)
    assert _fit_default_max_tokens(params, prompt_tokens=6, context=16) is params
    assert capsys.readouterr().err == ""


def test_one_token_short_is_cut_and_reported(capsys):
    """room = max_tokens - 1: cut to exactly the room (hand arithmetic: 16 - 7 = 9) and said on stderr."""
    out = _fit_default_max_tokens(SamplingParams(max_tokens=10), prompt_tokens=7, context=16)
    assert out.max_tokens == 9
    assert "max_tokens 10 cut to 9" in capsys.readouterr().err


def test_a_full_context_is_left_for_the_length_check(capsys):
    """room 0 (prompt fills the context): returned unchanged (LLM.check_length then names the context),
    never replaced by max_tokens 0."""
    params = SamplingParams(max_tokens=10)
    assert _fit_default_max_tokens(params, prompt_tokens=16, context=16) is params
    assert capsys.readouterr().err == ""
