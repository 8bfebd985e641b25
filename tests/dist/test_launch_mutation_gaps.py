"""Gaps a mutation audit of ``dist/launch.py`` found in ``spawn`` as the Python API uses it (relay off, or on
with rank 0 ending well): the environment and threads each rank gets, the traceback of a rank's exception
in ``RankExited``, the ``timeout`` deadline, a rank that outlives rank 0 by ``stop_wait``, and a stop signal
without relaying stopping every rank at once; plus the small helpers (``exit_description``,
``rank_threads``, ``first_report``). Ranks here import nothing but torch: a few seconds per spawn; each test
checks that no rank is left."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from nonstop.dist.launch import RankExited, exit_description, first_report, rank_threads, spawn
from tests.dist.procs import gone_within, launched

RANK_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "EXTRA")


def _children() -> list[int]:
    import multiprocessing

    return [p.pid for p in multiprocessing.active_children()]


def writes_its_environment(out_dir: str) -> None:
    import torch

    rank = os.environ["RANK"]
    facts = {k: os.environ.get(k) for k in RANK_ENV}
    facts["threads"] = torch.get_num_threads()
    facts["pid"] = os.getpid()
    Path(out_dir, f"{rank}.json").write_text(json.dumps(facts))


def fails_in_rank_1() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("rank 1 broke on purpose")


def sleeps(seconds: float, out_dir: str) -> None:
    Path(out_dir, f"{os.environ['RANK']}.pid").write_text(str(os.getpid()))
    time.sleep(seconds)


def rank_1_sleeps(out_dir: str) -> None:
    Path(out_dir, f"{os.environ['RANK']}.pid").write_text(str(os.getpid()))
    if os.environ["RANK"] == "1":
        time.sleep(60)


def _pids(out_dir: Path, world: int) -> list[int]:
    return [int((out_dir / f"{r}.pid").read_text()) for r in range(world) if (out_dir / f"{r}.pid").exists()]


def test_each_rank_gets_torchruns_environment_and_its_threads(tmp_path):
    spawn(writes_its_environment, 2, (str(tmp_path),), threads=3, env={"EXTRA": "x"}, timeout=120)
    facts = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert [(f["RANK"], f["LOCAL_RANK"]) for f in facts] == [("0", "0"), ("1", "1")]
    for f in facts:
        assert (f["WORLD_SIZE"], f["LOCAL_WORLD_SIZE"], f["MASTER_ADDR"], f["EXTRA"]) == ("2", "2", "127.0.0.1", "x")
        assert f["MASTER_PORT"] == facts[0]["MASTER_PORT"] and int(f["MASTER_PORT"]) > 0
        assert f["threads"] == 3
    assert len({f["pid"] for f in facts}) == 2


def test_a_ranks_exception_is_named_with_its_traceback():
    with pytest.raises(RankExited) as exc:
        spawn(fails_in_rank_1, 2, timeout=120)
    assert exc.value.rank == 1 and exc.value.code == 1 and exc.value.codes[0] == 0, exc.value.codes
    text = str(exc.value)
    assert text.startswith("rank 1 failed:\n") and "ValueError: rank 1 broke on purpose" in text, text
    assert not _children()


def test_ranks_still_running_at_the_timeout_are_stopped(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RankExited) as exc:
        spawn(sleeps, 2, (60.0, str(tmp_path)), timeout=8)
    assert time.monotonic() - t0 < 30
    assert exc.value.rank == -1 and exc.value.code is None and str(exc.value) == "the ranks did not finish within 8 s"
    assert not _children() and not gone_within(_pids(tmp_path, 2), 5)


def test_a_rank_that_outlives_rank_0_by_stop_wait_is_named(tmp_path):
    """With relay (the CLI's launcher) rank 0 ending well tells the others to stop; one still running
    ``stop_wait`` seconds later is stopped and named."""
    t0 = time.monotonic()
    with pytest.raises(RankExited) as exc:
        spawn(rank_1_sleeps, 2, (str(tmp_path),), relay=True, stop_wait=1.0, timeout=120)
    assert time.monotonic() - t0 < 30
    assert exc.value.rank == 1 and exc.value.code is None and exc.value.codes[0] == 0
    assert str(exc.value) == "rank 1 did not end within 1 s of rank 0"
    assert not _children() and not gone_within(_pids(tmp_path, 2), 5)


LAUNCHER = """
import sys
from nonstop.dist.launch import spawn
from nonstop.stops import Terminated
from tests.dist.test_launch_mutation_gaps import sleeps
try:
    spawn(sleeps, 2, (60.0, sys.argv[1]), timeout=120)
except Terminated:
    print("terminated", flush=True)
"""


def test_without_relay_a_stop_signal_stops_every_rank_at_once(tmp_path):
    with launched(["-c", LAUNCHER, str(tmp_path)]) as proc:
        end = time.monotonic() + 120
        while len(pids := _pids(tmp_path, 2)) < 2:
            assert proc.poll() is None and time.monotonic() < end, proc.communicate()
            time.sleep(0.1)
        proc.ranks()
        os.kill(proc.pid, signal.SIGTERM)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=60)
        seconds = time.monotonic() - t0
        assert not gone_within(pids, 5)
    assert out.strip() == "terminated" and proc.returncode == 0, err
    assert seconds < 10, f"the ranks were stopped {seconds:.1f} s after SIGTERM"


def test_exit_descriptions():
    assert exit_description(None) == "did not end"
    assert exit_description(0) == "exited with code 0"
    assert exit_description(3) == "exited with code 3"
    assert exit_description(-signal.SIGKILL) == "was killed by SIGKILL"
    assert exit_description(-signal.SIGSEGV) == "was killed by SIGSEGV"


def test_rank_threads_share_the_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert [rank_threads(w) for w in (1, 2, 3, 4, 16, 64)] == [16, 8, 5, 4, 1, 1]
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert rank_threads(2) == 1


def test_first_report_prints_each_line_once_per_launch(tmp_path, monkeypatch):
    from nonstop.dist.launch import REPORTS_ENV

    monkeypatch.delenv(REPORTS_ENV, raising=False)
    assert first_report("nonstop: error: x") and first_report("nonstop: error: x")  # outside a launch: always
    monkeypatch.setenv(REPORTS_ENV, str(tmp_path / "reports"))
    assert first_report("nonstop: error: x")
    assert not first_report("nonstop: error: x")
    assert first_report("nonstop: error: x y")  # another line (it contains the first)
    assert not first_report("nonstop: error: x y")
