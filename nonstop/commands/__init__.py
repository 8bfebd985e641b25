"""Subcommands of the ``nonstop`` CLI, one module each (``add_parser(subparsers)`` sets ``run``)."""

from nonstop.commands import chat, generate, gpucheck, info, perplexity, plan, program, serve, synth, train, tune

COMMANDS = {
    "chat": chat,
    "generate": generate,
    "gpucheck": gpucheck,
    "info": info,
    "perplexity": perplexity,
    "plan": plan,
    "program": program,
    "serve": serve,
    "synth": synth,
    "train": train,
    "tune": tune,
}
