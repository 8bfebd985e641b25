"""Sizes and counts printed with three significant digits (``size_text`` in refusals, ``human`` in the
``program`` / ``info`` tables): a value that rounds up to 1000 of a unit moves to the next unit (never
``1e+03 MB``), and past the largest unit the digits stay a plain number."""

from __future__ import annotations

import pytest

from nonstop.cli import main
from nonstop.commands.common import human
from nonstop.program.preflight import size_text


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 B"),
        (512, "512 B"),
        (999.4, "999 B"),
        (999.6, "1 KB"),
        (1234, "1.23 KB"),
        (999_552, "1 MB"),
        (999_700_000, "1 GB"),
        (23e9, "23 GB"),
        (1.56e12, "1.56 TB"),
        (999.7e12, "1 PB"),
        (1.2e16, "12 PB"),
        (1.2e19, "12000 PB"),
    ],
)
def test_size_text_rounds_before_choosing_the_unit(n, text):
    assert size_text(n) == text


@pytest.mark.parametrize(
    "n, text",
    [
        (7, "7"),
        (999.4, "999"),
        (999.6, "1K"),
        (16_384, "16.4K"),
        (999_552, "1M"),
        (9.06e6, "9.06M"),
        (-1500, "-1.5K"),
        (2.5e15, "2.5P"),
        (3e18, "3000P"),
    ],
)
def test_human_rounds_before_choosing_the_suffix(n, text):
    assert human(n) == text
    assert human(n, "B") == text + "B"


def test_program_table_never_prints_exponents(capsys):
    """k3-nano's mla_attn at context 6135 reads w_uv (16384 B) + activations + 6136 keys of 160 B = 999,552 B,
    which the table printed as 1e+03K."""
    assert main(["program", "--context", "6135"]) == 0
    out = capsys.readouterr().out
    assert "e+0" not in out
    row = next(line for line in out.splitlines() if line.split()[:2] == ["L3.mla_attn", "mla_attn"])
    assert "1M" in row.split()
