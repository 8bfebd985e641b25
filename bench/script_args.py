"""What the ``bench/`` scripts share on their command line, so a bad value never ends in a traceback.

  positive_int, non_negative_int, positive_float, non_negative_float, thread_count
                        the CLI's own argument types (``nonstop.commands.common``): a bad value is argparse's one
                        ``error:`` line (exit 2) before anything runs
  int_list(lo, hi)      an argument type: comma-separated integers in lo..hi ("2,4" -> [2, 4])
  choice_list(names)    an argument type: comma-separated names, each one of ``names``
  results_path(name)    ``bench/results/<name>`` of this repository, wherever the script is run from
  check_out(path)       ``path`` as a file a script can write its results to, checked before any work: its folder
                        is created and must take a new file; a ValueError naming ``flag`` and why otherwise
  out_file              an argument type: ``check_out`` of the value (argparse's one ``error:`` line)
  out_folder            an argument type: a folder results are written into, checked the same way
  add_out_arg(ap, name) ``--out`` (an ``out_file``), by default ``results_path(name)``
  MODEL_HELP            the help of a script's ``--model``
  run(main)             ``main()`` under the CLI's ``user_errors``: an error the user can fix (a model that does not
                        exist, a server that does not answer) is one ``nonstop: error:`` line (exit 2)

Scripts import it as ``from script_args import ...`` (their folder, ``bench/``, is on sys.path when they run); it
puts the repository first on sys.path, so they run this tree's ``nonstop``, installed or not.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
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
    "check_out",
    "choice_list",
    "decode_tokens",
    "int_list",
    "non_negative_float",
    "non_negative_int",
    "out_file",
    "out_folder",
    "positive_float",
    "positive_int",
    "results_path",
    "run",
    "thread_count",
]

RESULTS = ROOT / "bench" / "results"
MODEL_HELP = "checkpoint directory, bundled model or preset name (default %(default)s)"


def decode_tokens(text: str) -> int:
    """An argparse type: new tokens a timed generation decodes, at least 2 (a decode rate is (N - 1) tokens over
    the time from the first to the N-th: one token has none)."""
    n = positive_int(text)
    if n < 2:
        raise argparse.ArgumentTypeError(
            f"expected at least 2 (the decode rate leaves out the first new token), got {n}"
        )
    return n


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


def check_out(path: str | Path, flag: str = "--out") -> Path:
    """``path`` as a file the results can be written to, so a bad path fails before the run rather than after
    it: its folder is created (as the writers do) and must take a new file (probed with one, removed at once:
    permission bits alone do not tell, e.g. for root or in /proc), and an existing ``path`` must be a writable
    file. A ValueError naming ``flag`` (when given), the path and why otherwise."""
    out = Path(path)
    lead = f"{flag} {out}".strip()
    if not str(path).strip():
        raise ValueError(f"{flag or 'the path'} is empty: give the file to write to")
    try:
        is_dir = out.is_dir()
    except OSError as exc:  # a folder on the way this user may not search
        raise ValueError(f"{lead}: cannot be checked ({exc.strerror or exc})") from None
    if is_dir:
        raise ValueError(f"{lead} is a directory: give a file path, e.g. {out / 'result.json'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = "a file is in the way" if isinstance(exc, (FileExistsError, NotADirectoryError)) else exc.strerror
        raise ValueError(f"{lead}: cannot create its folder {out.parent} ({why or exc})") from None
    try:
        fd, probe = tempfile.mkstemp(dir=out.parent, prefix=".nonstop-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"{lead}: cannot create a file in {out.parent} ({exc.strerror or exc})") from None
    if out.exists() and not os.access(out, os.W_OK):
        raise ValueError(f"{lead}: the file exists and is not writable")
    return out


def out_file(text: str) -> Path:
    """An argparse type: ``check_out`` of the value (a bad path is argparse's one ``error:`` line, naming the
    option, exit 2)."""
    try:
        return check_out(text, flag="")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def out_folder(text: str) -> Path:
    """An argparse type: a folder the results can be written into, checked as ``check_out`` checks a file's
    (created if missing; a file in the way, or one that takes no new file, is argparse's one ``error:`` line)."""
    folder = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("the folder is empty: give the folder to write to")
    if folder.exists() and not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{folder} is a file: give a folder")
    try:
        check_out(folder / "probe.json", flag="")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return folder


def add_out_arg(ap: argparse.ArgumentParser, name: str) -> None:
    """``--out``: the results JSON (an ``out_file``, checked as the arguments are parsed), by default
    ``bench/results/<name>``."""
    ap.add_argument(
        "--out", type=out_file, default=str(results_path(name)), help=f"JSON path (default bench/results/{name})"
    )


def run(main) -> None:
    """Call ``main()`` as ``nonstop``'s commands run: ``nonstop.commands.errors.user_errors`` turns a user's error
    into one ``nonstop: error:`` line (exit 2) and anything else into one line saying it is a bug (exit 1;
    ``NONSTOP_DEBUG=1`` shows the traceback). A rank of a spawned launch that ended badly (``RankExited``: one
    killed as it started, out of memory ...) is no bug of nonstop's: one ``nonstop: error:`` line naming it
    (exit 3, as a failed rank's)."""
    from nonstop.commands.errors import user_errors
    from nonstop.dist.launch import RankExited

    with user_errors():
        try:
            main()
        except RankExited as exc:
            print(f"nonstop: error: {exc}; the other ranks were stopped", file=sys.stderr)
            raise SystemExit(3) from None
