"""Subcommands of the ``nonstop`` CLI, one module each (``add_parser(subparsers)`` sets ``run``)."""

from nonstop.commands import generate, info, serve, synth

COMMANDS = {"generate": generate, "info": info, "serve": serve, "synth": synth}
