"""Subcommands of the ``nonstop`` CLI, one module each (``add_parser(subparsers)`` sets ``run``)."""

from nonstop.commands import generate, gpucheck, info, perplexity, program, serve, synth, train

COMMANDS = {
    "generate": generate,
    "gpucheck": gpucheck,
    "info": info,
    "perplexity": perplexity,
    "program": program,
    "serve": serve,
    "synth": synth,
    "train": train,
}
