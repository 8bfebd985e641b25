"""``bench/dist_link.py`` run end to end on CPU (gloo), as a user runs it: a small bounded run finishes and its
JSON says what it printed, with positive figures and the fit it documents; a rank that dies as it starts is
a named error. Each run is a process of its own (its own session, killed with its ranks on the way out)."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys

import pytest

from tests.bench_script import BENCH_DIR
from tests.dist.procs import ROOT

SIZES = [
    0,
    256,
    4096,
    65536,
    262144,
    1048576,
]  # the sizes the docstring promises, bytes to each other rank

# the second rank the launcher starts SIGKILLs itself as its interpreter starts (as the OOM killer would)
KILL_SECOND_RANK = """
import os, signal, sys
if "--multiprocessing-fork" in sys.argv:
    try:
        os.close(os.open(os.environ["DL_TEST_FLAG"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        os.kill(os.getpid(), signal.SIGKILL)
"""


def _run(argv: list[str], tmp_path, env: dict | None = None) -> subprocess.CompletedProcess:
    kw = {
        "cwd": tmp_path,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
        "text": True,
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, str(BENCH_DIR / "dist_link.py"), *argv],
        env=env,
        **kw,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the ranks too, whatever happened
        except OSError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.timeout(150)
def test_a_small_run_writes_json_that_matches_what_it_prints(tmp_path):
    """One world of 2, a few calls: exit 0; one row with every documented size, positive times in us; the
    latency and bandwidth are the least-squares fit t = latency + (W-1)·s/bandwidth of the figures it
    lists (refitted here); the stderr line and the JSON agree. Catches a wrong fit, unit or row."""
    out_json = tmp_path / "link.json"
    run = _run(
        ["--worlds", "2", "--reps", "2", "--trials", "1", "--out", str(out_json)],
        tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out_json.read_text())
    assert (data["benchmark"], data["device"], data["backend"]) == (
        "dist_link",
        "cpu",
        "gloo",
    )
    assert (data["reps"], data["trials"]) == (2, 1)
    (row,) = data["rows"]
    assert row["world"] == 2
    per_call = {int(k): v for k, v in row["us_per_call_by_bytes_per_peer"].items()}
    assert sorted(per_call) == SIZES
    assert all(v > 0 for v in per_call.values()), per_call
    # the fit, by hand: x = bytes a rank sends per call = (W - 1)·s, y = seconds
    xs = [(2 - 1) * s for s in SIZES]
    ys = [per_call[s] * 1e-6 for s in SIZES]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    latency_us = (my - slope * mx) * 1e6
    assert row["latency_us"] == pytest.approx(latency_us, abs=0.2)  # the listed figures are rounded to 0.1 us
    if slope > 0:
        assert row["bandwidth_GBps"] == pytest.approx(1 / slope / 1e9, rel=1e-2, abs=2e-3)
    else:
        assert row["bandwidth_GBps"] is None
    line = next(line for line in run.stderr.splitlines() if line.startswith("W=2:"))
    said = re.match(r"W=2: latency (\S+) us, bandwidth (\S+) GB/s", line)
    assert said and float(said[1]) == row["latency_us"], line
    assert said[2] == str(row["bandwidth_GBps"]), line
    assert data["peer_copy_bandwidth"]["copy_GBps"] > 0
    assert f"wrote {out_json}" in run.stdout, run.stdout


@pytest.mark.timeout(150)
def test_a_rank_killed_as_it_starts_is_a_named_error_not_a_bug_report(tmp_path):
    """A rank is killed by SIGKILL as it starts (the OOM killer, an operator). The script said "nonstop:
    internal error: RankExited: rank 1 was killed by SIGKILL (a bug: please report it; ...)": the user is
    told to report a bug in nonstop for their host's doing (``script_args.run`` treats ``RankExited`` as an
    internal error; the CLI's launcher says "nonstop: error: rank 1 was killed by SIGKILL ...")."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(KILL_SECOND_RANK)
    env = {
        "PYTHONPATH": f"{site}{os.pathsep}{ROOT}",
        "DL_TEST_FLAG": str(tmp_path / "flag"),
    }
    out_json = tmp_path / "link.json"
    run = _run(
        ["--worlds", "2", "--reps", "2", "--trials", "1", "--out", str(out_json)],
        tmp_path,
        env,
    )
    assert run.returncode != 0 and not out_json.exists(), run.stderr[-3000:]
    said = [line for line in run.stderr.splitlines() if line.startswith("nonstop:")]
    # the second rank process to start is the one killed: rank 1 mostly, rank 0 when it starts later (a busy host)
    assert len(said) == 1 and re.search(r"rank [01] was killed by SIGKILL", said[0]), run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert said[0].startswith("nonstop: error:"), said  # not "internal error ... a bug: please report it"
