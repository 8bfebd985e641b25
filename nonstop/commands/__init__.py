"""Subcommands of the ``nonstop`` CLI, one module each (``add_parser(subparsers)`` sets ``run``)."""

from nonstop.commands import generate, info, perplexity, program, serve, synth, train, tune

COMMANDS = {"generate": generate, "info": info, "perplexity": perplexity, "program": program, "serve": serve, "synth": synth, "train": train, "tune": tune}
