"""Gap the k8 mutation audit found in ``engine/distributed.print_failure_and_exit``: in a launch it leaves its line
to the launcher (``leave_failure``) instead of printing it (ranks failing together printed one line each)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_clis_failure_exit_in_a_launch_leaves_its_line(tmp_path):
    reports = tmp_path / "reports"
    reports.write_text("")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NONSTOP_RANK_REPORTS": str(reports)}
    code = "from nonstop.engine.distributed import print_failure_and_exit as f; f('rank 1: gone')"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and r.stderr == "", r.stderr

    from nonstop.dist.launch import left_failure

    assert left_failure(str(reports)) == "nonstop: error: rank 1: gone"
