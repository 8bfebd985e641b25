"""``nonstop generate`` paths other tests leave open: an explicit ``--repetition-penalty 1`` under speculative
decoding replaces the checkpoint's penalty, so nothing is said about dropping it."""

from __future__ import annotations

from nonstop.cli import main


def test_an_explicit_neutral_penalty_under_speculative_decoding_is_not_reported_as_dropped(capsys):
    """k3-nano's generation_config.json sets repetition_penalty 1.1; ``--repetition-penalty 1`` replaces it, so
    the "not applying the checkpoint's repetition_penalty" note (for when the checkpoint's value is silently left
    out) must not appear; without the flag it does, once."""
    base = ["generate", "--backend", "reference", "-n", "2", "--speculative", "ngram", "--temperature", "0"]
    assert main([*base, "--repetition-penalty", "1", "The"]) == 0
    assert "not applying" not in capsys.readouterr().err
    assert main([*base, "The"]) == 0
    assert capsys.readouterr().err.count("not applying the checkpoint's repetition_penalty 1.1") == 1
