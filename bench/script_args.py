"""What the ``bench/`` scripts share on their command line, so a bad value never ends in a traceback.

  positive_int, non_negative_int, positive_float, non_negative_float, thread_count
                        the CLI's own argument types (``nonstop.commands.common``): a bad value is argparse's one
                        ``error:`` line (exit 2) before anything runs
  int_list(lo, hi)      an argument type: comma-separated integers in lo..hi ("2,4" -> [2, 4])
  choice_list(names)    an argument type: comma-separated names, each one of ``names``
  results_path(name)    ``bench/results/<name>`` of this repository, wherever the script is run from
  add_out_arg(ap, name) ``--out``, by default ``results_path(name)``
  MODEL_HELP            the help of a script's ``--model``
  run(main)             ``main()`` under the CLI's ``user_errors``: an error the user can fix (a model that does not
                        exist, a server that does not answer) is one ``nonstop: error:`` line (exit 2)

Scripts import it as ``from script_args import ...`` (their folder, ``bench/``, is on sys.path when they run); it
puts the repository first on sys.path, so they run this tree's ``nonstop``, installed or not.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # this tree's nonstop, installed or not
    sys.path.insert(0, str(ROOT))

from nonstop.commands.common import (  # noqa: E402
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    thread_count,
)

__all__ = [
    "MODEL_HELP",
    "add_out_arg",
    "choice_list",
    "int_list",
    "non_negative_float",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "results_path",
    "run",
    "thread_count",
]

RESULTS = ROOT / "bench" / "results"
MODEL_HELP = "checkpoint directory, bundled model or preset name (default %(default)s)"


def int_list(lo: int = 1, hi: int | None = None):
    """An argparse type: comma-separated integers, each in ``lo``..``hi`` (no upper bound when ``hi`` is None)."""
    bound = f">= {lo}" if hi is None else f"in {lo}..{hi}"

    def parse(text: str) -> list[int]:
        try:
            values = [int(t) for t in text.split(",") if t.strip()]
        except ValueError:
            values = []
        if not values or any(v < lo or (hi is not None and v > hi) for v in values):
            raise argparse.ArgumentTypeError(f"expected comma-separated integers {bound}, got {text!r}")
        return values

    return parse


def choice_list(names):
    """An argparse type: comma-separated names, each one of ``names`` ("ngram,dspark" -> ["ngram", "dspark"])."""
    names = tuple(names)

    def parse(text: str) -> list[str]:
        got = [t.strip() for t in text.split(",") if t.strip()]
        unknown = [g for g in got if g not in names]
        if not got or unknown:
            what = f"unknown {', '.join(map(repr, unknown))}" if unknown else "none given"
            raise argparse.ArgumentTypeError(f"{what}; choose comma-separated from: {', '.join(names)}")
        return got

    return parse


def results_path(name: str) -> Path:
    """``bench/results/<name>`` in this repository (not the current directory)."""
    return RESULTS / name


def add_out_arg(ap: argparse.ArgumentParser, name: str) -> None:
    """``--out``: the results JSON, by default ``bench/results/<name>``."""
    ap.add_argument("--out", default=str(results_path(name)), help=f"JSON path (default bench/results/{name})")


def run(main) -> None:
    """Call ``main()`` as ``nonstop``'s commands run: ``nonstop.commands.errors.user_errors`` turns a user's error
    into one ``nonstop: error:`` line (exit 2) and anything else into one line saying it is a bug (exit 1;
    ``NONSTOP_DEBUG=1`` shows the traceback)."""
    from nonstop.commands.errors import user_errors

    with user_errors():
        main()
