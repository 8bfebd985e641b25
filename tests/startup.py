"""How long a fresh ``nonstop`` process takes to start on this host now (the interpreter, torch and the
commands imported), so that a test asking "refused within seconds" allows for a busy host."""

from __future__ import annotations

import subprocess
import sys
import time


def startup_s() -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import nonstop.cli; nonstop.cli.build_parser()"], check=True, timeout=300)
    return time.monotonic() - t0


def within_seconds_of_starting(elapsed: float, baseline: float) -> bool:
    """True when a command took at most a few seconds more than starting twice (the startup measured
    just before, as loaded as the command was; a command that loaded a model would take minutes)."""
    return elapsed < 2 * baseline + 10
