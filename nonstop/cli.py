"""``nonstop``: the command line. Each subcommand lives in ``nonstop/commands/`` and has --help."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

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


def _parse(argv: list[str] | None):
    """(parser, args), or None when Ctrl-C came while the commands' imports (torch among them: a second or
    two) ran. A KeyboardInterrupt raised inside some callbacks of the import machinery is swallowed by
    Python, so the interrupt is noted by the handler itself and looked at afterwards."""
    interrupted = []

    def note(signum, frame):
        interrupted.append(signum)
        raise KeyboardInterrupt

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, note) if main_thread else None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        return None
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return None if interrupted else (parser, args)


def main(argv: list[str] | None = None) -> int:
    parsed = _parse(argv)
    if parsed is None:  # Ctrl-C while starting is not a bug
        print("nonstop: interrupted", file=sys.stderr)
        return 130
    parser, args = parsed
    if args.command is None:
        parser.print_help()
        return 2
    from nonstop.commands.errors import user_errors

    with user_errors():
        return int(args.run(args) or 0)
    return 2


if __name__ == "__main__":
    sys.exit(main())
