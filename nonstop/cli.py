"""``nonstop``: the command line. Each subcommand lives in ``nonstop/commands/`` and has --help."""

from __future__ import annotations

import argparse
import sys

from nonstop import __version__


def build_parser() -> argparse.ArgumentParser:
    from nonstop.commands import COMMANDS

    parser = argparse.ArgumentParser(
        prog="nonstop",
        description="nonstop: decode hybrid KDA/MLA/MoE models (Kimi K3 family) fast at low concurrency. "
        "The default model is the bundled k3-nano, which runs offline on a CPU.",
    )
    parser.add_argument("--version", action="version", version=f"nonstop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:  # the commands' imports (torch among them) take a second or two: Ctrl-C there is not a bug
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print("nonstop: interrupted", file=sys.stderr)
        return 130
    if args.command is None:
        parser.print_help()
        return 2
    from nonstop.commands.errors import user_errors

    with user_errors():
        return int(args.run(args) or 0)
    return 2


if __name__ == "__main__":
    sys.exit(main())
