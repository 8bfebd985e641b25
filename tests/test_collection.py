"""The suite collects every test file under tests/: pytest's default ``norecursedirs`` skips any directory named
``dist``, and so tests/dist (the multi-process tests) went unrun until pyproject.toml set the list itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_test_file_under_tests_is_collected():
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    collected = {line.split("::")[0] for line in run.stdout.splitlines() if "::" in line}
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    assert "tests/dist/test_torchrun.py" in on_disk
    assert not on_disk - collected, f"test files the suite never collects: {sorted(on_disk - collected)}"
