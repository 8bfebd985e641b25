"""Subcommands of the ``nonstop`` CLI, one module each (``add_parser(subparsers)`` sets ``run``)."""

from nonstop.commands import generate, info, program, serve, synth

COMMANDS = {"generate": generate, "info": info, "program": program, "serve": serve, "synth": synth}
