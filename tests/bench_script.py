"""A ``bench/`` script loaded as a module for its test (benchmarks are scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


def load_bench(script: str):
    """``bench/<script>`` as a fresh module, with ``bench/`` importable as it is when the script runs
    (``from decode import rel_err``)."""
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    spec = importlib.util.spec_from_file_location(f"bench_{Path(script).stem}", BENCH_DIR / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
