"""Subcommands of the ``nonstop`` CLI, one module each (``add_parser(subparsers)`` sets ``run``)."""

from nonstop.commands import generate, info, perplexity, plan, program, serve, synth, train

COMMANDS = {"generate": generate, "info": info, "perplexity": perplexity, "plan": plan, "program": program, "serve": serve, "synth": synth, "train": train}
