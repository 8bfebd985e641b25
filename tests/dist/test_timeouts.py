"""The two waits of a layout: the ranks' rendezvous gets at least ``RENDEZVOUS_S`` whatever the collective
timeout (``--dist-timeout 0.001`` made the store connection itself time out: a c10d stack and "internal
error"), a rendezvous that fails is one line naming it, and the collective timeout keeps its range: the
flag refuses what no collective can use, and a huge timeout from Python no longer overflows rank 0's
keep-alive waits."""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from nonstop.cli import main
from nonstop.dist.launch import free_port, spawn
from nonstop.dist.layout import Layout
from tests.dist.procs import ENV, ROOT
from tests.dist.test_keepalive import _executor

LATE = 3.0  # how late rank 1 joins, and then answers, in seconds
TIMEOUT = 1.0  # the collective timeout of that run


def meeting_late(out_dir: str) -> None:
    """Rank 1 joins ``LATE`` s after rank 0 (longer than the collective timeout); once both have summed, it
    waits ``LATE`` s again, and rank 0's next sum must fail after the collective timeout, not the rendezvous's."""
    from nonstop.dist.comm import RankFailure, init

    rank = int(os.environ["RANK"])
    if rank == 1:
        time.sleep(LATE)
    comm = init(Layout.make(1, 2), "cpu", TIMEOUT)
    t = torch.ones(1)
    comm.all_reduce_control(t)
    result = {"sum": t.item()}
    if rank == 1:
        time.sleep(LATE)
    t0 = time.monotonic()
    try:
        comm.all_reduce_control(torch.ones(1))
    except RankFailure as exc:
        result.update(error=str(exc), seconds=time.monotonic() - t0)
    Path(out_dir, f"{rank}.pkl").write_bytes(pickle.dumps(result))
    os._exit(0)  # the group is broken: nothing to leave


def test_a_rank_later_than_the_collective_timeout_still_joins(tmp_path):
    spawn(meeting_late, 2, (str(tmp_path),), timeout=120)
    first = pickle.loads((tmp_path / "0.pkl").read_bytes())
    assert first["sum"] == 2.0, first
    assert "summing over all ranks failed" in first["error"], first
    assert first["seconds"] < LATE, first  # the collective timeout, not the rendezvous's


RENDEZVOUS_ALONE = """
from nonstop.dist.comm import RankFailure, init
from nonstop.dist.layout import Layout
try:
    init(Layout.make(1, 2), "cpu", 1.0, rendezvous=1.0)
except RankFailure as exc:
    print(exc)
"""


def test_a_failed_rendezvous_is_one_line_naming_it():
    """Rank 1 alone, nobody listening at MASTER_PORT."""
    port = free_port()
    env = {**ENV, "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    r = subprocess.run(
        [sys.executable, "-c", RENDEZVOUS_ALONE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    said = f"rank 1: the rendezvous with the other ranks at 127.0.0.1:{port} failed within 1 s ("
    assert r.stdout.startswith(said) and len(r.stdout.splitlines()) == 1, r.stdout


@pytest.mark.parametrize("value", ["0.001", "0.5", "1e12", "86401"])
def test_the_flag_refuses_timeouts_no_collective_can_use(value, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--tp", "2", "--dist-timeout", value, "hi"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--dist-timeout: expected seconds from 1 to 86400 (a day), got {value}" in err, err


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf, threading.TIMEOUT_MAX * 2])
def test_init_refuses_a_timeout_out_of_range(value):
    from nonstop.dist.comm import init

    with pytest.raises(ValueError, match="timeout must be a number of seconds in"):
        init(Layout.make(1, 1), "cpu", value)


def test_a_huge_timeout_leaves_the_keepalive_running_and_close_prompt():
    """timeout / 16 and timeout beyond threading.TIMEOUT_MAX: OverflowError in the thread and in close()."""
    failures = []
    previous, threading.excepthook = threading.excepthook, failures.append
    try:
        ex, comm = _executor(timeout=1e12)
        time.sleep(0.3)
        assert ex._keepalive.is_alive() and not failures, failures
        ex.close()
    finally:
        threading.excepthook = previous
    assert not ex._keepalive.is_alive() and comm.sent == ["stop"]
