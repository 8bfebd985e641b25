"""Gaps in the tests of ``nonstop/cli.py`` found by mutation: ``nonstop`` without a command, and Ctrl-C while
the commands' imports run."""

from __future__ import annotations

import signal

from nonstop import cli


def test_no_command_prints_the_help_and_exits_2(capsys):
    """``nonstop`` alone prints the usage with the list of commands on stdout and returns 2 (not a traceback
    from a missing ``args.run``, and not silence)."""
    assert cli.main([]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: nonstop") and "perplexity" in out and "gpucheck" in out


def test_ctrl_c_during_the_parse_exits_130_and_restores_the_handler(monkeypatch, capsys):
    """A KeyboardInterrupt while the parser is built is "interrupted", status 130 (the shell's code for
    SIGINT), and the SIGINT handler in place before is put back."""

    def interrupted():
        raise KeyboardInterrupt

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["info"]) == 130
    assert capsys.readouterr().err.strip() == "nonstop: interrupted"
    assert signal.getsignal(signal.SIGINT) is before


def test_a_swallowed_ctrl_c_during_the_parse_still_interrupts(monkeypatch, capsys):
    """Python swallows a KeyboardInterrupt raised in some import callbacks: the handler notes the signal, and
    main returns 130 rather than running the command it parsed."""
    real = cli.build_parser

    def swallowing():
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass  # what the import machinery does
        return real()

    monkeypatch.setattr(cli, "build_parser", swallowing)
    assert cli.main(["info"]) == 130
    assert "nonstop: interrupted" in capsys.readouterr().err
