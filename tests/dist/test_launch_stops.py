"""How a local launch (``start_ranks`` / ``nonstop.dist.spawn``) ends and what it says: a stop signal goes to
rank 0, which stops as a single process would, and one line says so; a rank killed, hung or failing is
named once, the launcher stopping the others itself (no torch warnings) and promptly; an error every rank
meets is printed once; a broken checkpoint is refused before any rank starts; a server under a layout
stopped with SIGTERM answers its request in flight and exits 143.

Most tests run ``start_ranks`` on ranks that only sum a number over a gloo group (``launch_workers.py``,
no model: seconds each); every process is started by ``procs.launched`` (its tree is killed whatever
happens), every collective and every wait has a timeout, and each test checks that no rank is left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest

from tests.dist.launch_workers import SECONDS
from tests.dist.procs import ROOT, gone_within, launched
from tests.server.in_flight import long_request, wait_until_up

LAUNCH = """
import argparse, sys
from nonstop.commands.layout_args import start_ranks
from nonstop.dist.layout import Layout
from tests.dist.launch_workers import summing
out, mode, world, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
args = argparse.Namespace(run=summing, dir=out, mode=mode, timeout=timeout, threads=1)
sys.exit(start_ranks(args, Layout.make(2 if world == 4 else 1, 2, world)))
"""
# the launch, but a stop signal comes from another process while the launcher is still starting its ranks
# (they exist; it has not seen them yet): after the resource tracker had started (it unblocks the stop
# signals) a signal there was ignored, and the ranks ran on as if none had come
SIGNALLED_WHILE_STARTING = """
import os, subprocess, sys
import nonstop.dist.launch as launch
start, sig = launch.mp.start_processes, sys.argv[5]
def start_then_signal(*a, **kw):
    ctx = start(*a, **kw)
    print(*ctx.pids(), flush=True)
    subprocess.run([sys.executable, "-c", f"import os; os.kill({os.getpid()}, {sig})"], check=True)
    return ctx
launch.mp.start_processes = start_then_signal
"""
# the launch, but the second rank cannot be started (fork refused for want of memory)
SECOND_RANK_FAILS = """
import sys
import nonstop.dist.launch as launch
start = launch.mp.start_processes
def first_only(fn, args=(), nprocs=1, **kw):
    ctx = start(fn, args=args, nprocs=1, **kw)
    print(*ctx.pids(), flush=True)
    raise OSError(12, "Cannot allocate memory (starting rank 1)")
launch.mp.start_processes = first_only
"""
TORCH_WARNINGS = ("Terminating process", "forcefully exiting")


def _launch(tmp_path, mode: str = "sum", world: int = 2, timeout: float = 10.0, signal_while_starting=None):
    if signal_while_starting is None:
        return launched(["-c", LAUNCH, str(tmp_path), mode, str(world), str(timeout)])
    code = SIGNALLED_WHILE_STARTING + LAUNCH
    return launched(["-c", code, str(tmp_path), mode, str(world), str(timeout), str(int(signal_while_starting))])


def _rank_pids(proc, tmp_path, world: int, deadline: float = 120) -> list[int]:
    """The pids of ranks 0..world-1, once every rank has joined the group."""
    end = time.monotonic() + deadline
    files = [tmp_path / f"{r}.pid" for r in range(world)]
    while not all(f.exists() for f in files):
        assert proc.poll() is None, f"the launcher ended early: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < end, "the ranks did not start"
        time.sleep(0.1)
    proc.ranks()  # remembered: killed on the way out whatever happens
    return [int(f.read_text()) for f in files]


def _said(err: str) -> list[str]:
    """nonstop's lines on stderr, but the launcher's 'starting' line."""
    return [line for line in err.splitlines() if line.startswith("nonstop:") and "local ranks (" not in line]


@pytest.mark.parametrize(
    "target, sig, code, word",
    [
        ("group", signal.SIGINT, 130, "interrupted"),  # Ctrl-C in a terminal: every process gets it
        ("group", signal.SIGTERM, 143, "terminated"),  # a service manager stopping the whole group
        ("launcher", signal.SIGINT, 130, "interrupted"),
        ("launcher", signal.SIGTERM, 143, "terminated"),
    ],
)
def test_a_stop_signal_stops_every_rank_with_one_line(tmp_path, target, sig, code, word):
    with _launch(tmp_path) as proc:
        pids = _rank_pids(proc, tmp_path, 2)
        (os.killpg if target == "group" else os.kill)(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
        assert not gone_within(pids, 5)
    assert proc.returncode == code, err
    assert _said(err) == [f"nonstop: {word}"], err  # rank 0's line; no "another rank has died"


def test_rank_0_killed_is_named_and_the_others_stopped_quietly(tmp_path):
    with _launch(tmp_path) as proc:
        pids = _rank_pids(proc, tmp_path, 2)
        os.kill(pids[1], signal.SIGSTOP)  # a stopped rank 1 cannot say anything either
        os.kill(pids[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        assert not gone_within(pids, 5)
    assert proc.returncode == 1, err
    assert _said(err) == [
        "nonstop: error: rank 0 was killed by SIGKILL (the first rank to end); the other ranks were stopped"
    ], err
    assert not any(w in err for w in TORCH_WARNINGS), err


def test_a_hung_rank_is_stopped_promptly_without_torch_warnings(tmp_path):
    timeout = 3.0
    with _launch(tmp_path, timeout=timeout) as proc:
        pids = _rank_pids(proc, tmp_path, 2)
        os.kill(pids[1], signal.SIGSTOP)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        seconds = time.monotonic() - t0
        assert not gone_within(pids, 5)
    assert proc.returncode == 3, err
    lines = _said(err)
    assert len(lines) == 1 and lines[0].startswith("nonstop: error: rank 0: the sum failed"), err
    assert not any(w in err for w in TORCH_WARNINGS), err
    assert seconds < timeout + 10, f"the launcher ended {seconds:.1f} s after the hang"


def test_the_first_rank_to_die_is_named_last_and_rank_0s_status_kept(tmp_path):
    with _launch(tmp_path, world=4) as proc:
        pids = _rank_pids(proc, tmp_path, 4)
        os.kill(pids[2], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        assert not gone_within(pids, 5)
    assert proc.returncode == 3, err  # rank 0's own status (it noticed and said so)
    lines = _said(err)
    assert lines[-1] == (
        "nonstop: error: rank 2 was killed by SIGKILL (the first rank to end); the other ranks were stopped"
    ), err
    assert not any("rank 2" in line for line in lines[:-1]), err


def test_an_error_every_rank_meets_is_printed_once(tmp_path):
    with _launch(tmp_path, mode="error") as proc:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert _said(err) == ["nonstop: error: the same error in every rank"], err


def test_a_broken_checkpoint_is_refused_once_before_any_rank_starts(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(ROOT / "nonstop" / "assets" / "k3-nano", broken)
    with open(broken / "model.safetensors", "r+b") as fh:
        fh.truncate(17_000_000)
    argv = ["-m", "nonstop", "generate", "-m", str(broken), "--ep", "2", "-n", "4", "hi"]
    with launched(argv) as proc:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "starting 2 local ranks" not in err
    assert _said(err) == [line for line in err.splitlines() if line.strip()], err
    assert len(_said(err)) == 1 and "truncated file" in err, err


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 0)])
def test_a_stop_signal_to_a_serving_launcher_answers_the_request_in_flight(sig, code):
    """Rank 0 drains as a single process does (the request finishes or ends with a clean error after the
    grace period), tells the other rank to stop, and exits as the single-process server does: 143 after
    SIGTERM, 0 after Ctrl-C (as uvicorn; it was 130 and "interrupted; all ranks stopped"); no rank error."""
    from nonstop.dist.launch import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["-m", "nonstop", "serve", "--ep", "2", "--port", str(port), "--dist-timeout", "20", "--no-warmup"]
    with launched(argv) as proc:
        end = time.monotonic() + 180
        wait_until_up(url, proc, end)
        ranks = proc.ranks()
        client, reply = long_request(url, 1500, end)
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=90)
        client.join(30)
        assert not gone_within(ranks, 5)
    assert proc.returncode == code, err
    assert "error" not in reply, reply  # was: an empty reply (the followers were killed under rank 0)
    answer = json.loads(reply["body"])
    assert answer.get("choices") or "shutting down" in answer["error"]["message"], answer
    assert reply["status"] == (200 if answer.get("choices") else 503), reply
    assert not [line for line in _said(err) if "error" in line or "interrupted" in line], err


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_stop_signal_while_the_ranks_start_stops_them_with_one_line(tmp_path, sig, code, word):
    """The signal reaches the whole group as soon as the rank processes exist, before they run any of
    nonstop's code (Python's start-up, unpickling): it was a KeyboardInterrupt traceback in rank 0 and
    "rank 0 was killed by SIGINT", exit 1. It waits for the rank's handlers; every rank stops promptly."""
    with _launch(tmp_path) as proc:
        end = time.monotonic() + 60
        while len(ranks := proc.ranks()) < 2:
            assert proc.poll() is None and time.monotonic() < end, "the ranks were never started"
            time.sleep(0.005)
        os.killpg(proc.pid, sig)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        seconds = time.monotonic() - t0
        assert not gone_within(ranks, 5)
    assert proc.returncode == code, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    # rank 0's line, whether it was stopped as it started or in the command (as a single process says it)
    assert _said(err) == [f"nonstop: {word}"], err
    assert seconds < 20, f"the launch ended {seconds:.1f} s after the signal"


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_stop_signal_while_the_launcher_starts_the_ranks_is_not_lost(tmp_path, sig, code, word):
    """The signal reaches the launcher (not the ranks) while it is inside its start of the ranks: it was
    lost there, and the ranks summed on for a minute; the launcher relays it once it knows the ranks."""
    with _launch(tmp_path, signal_while_starting=sig) as proc:
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=SECONDS - 10)
        seconds = time.monotonic() - t0
        assert not gone_within([int(pid) for pid in out.split()], 5)
    assert proc.returncode == code, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert _said(err) == [f"nonstop: {word}"], err  # rank 0's, told by the launcher once it knew the ranks
    assert seconds < 30, f"the launch ended {seconds:.1f} s after it started"


def test_a_collective_failure_is_left_to_the_launcher_unless_an_error_was_printed(tmp_path, monkeypatch):
    """A follower whose connection to rank 0 closed after rank 0 printed why it ended (an error it met
    once loaded) stays quiet: it printed a second, wrong line ("receiving the next step failed"). Ranks
    failing together each printed their line, before the launcher's naming a killed rank."""
    from nonstop.dist.launch import REPORTS_ENV, first_report, leave_failure, left_failure

    monkeypatch.delenv(REPORTS_ENV, raising=False)
    assert not leave_failure("nonstop: error: rank 1: gone")  # outside a launch: the caller prints it
    reports = tmp_path / "reports"
    reports.write_text("")
    monkeypatch.setenv(REPORTS_ENV, str(reports))
    assert left_failure(str(reports)) is None
    assert leave_failure("nonstop: error: rank 1: gone") and leave_failure("nonstop: error: rank 2: gone")
    assert left_failure(str(reports)) == "nonstop: error: rank 1: gone"  # the first only
    assert first_report("ValueError: speculative num_tokens must be an integer in 0..15")
    assert left_failure(str(reports)) is None  # a rank printed its cause
    printed = tmp_path / "printed"
    printed.write_text("")
    monkeypatch.setenv(REPORTS_ENV, str(printed))
    assert first_report("ValueError: x") and leave_failure("nonstop: error: rank 1: gone")
    assert left_failure(str(printed)) is None  # a failure after a printed error is its consequence
    assert left_failure(str(tmp_path / "missing")) is None


def test_a_rank_that_cannot_start_stops_those_already_started(tmp_path):
    """Rank 0 was left running when rank 1 could not be started: the launcher's exit then waited for it (the
    collective timeout, here 60 s) and a launcher killed meanwhile left it behind."""
    argv = ["-c", SECOND_RANK_FAILS + LAUNCH, str(tmp_path), "sum", "2", "60"]
    with launched(argv) as proc:
        out, err = proc.communicate(timeout=40)
        assert not gone_within([int(pid) for pid in out.split()], 5)
    assert proc.returncode == 1 and "Cannot allocate memory (starting rank 1)" in err, err


def test_the_launchers_own_stop_of_rank_0_is_a_failure_not_a_stop_of_the_users(tmp_path):
    """Rank 1 fails while rank 0 waits (as a rank 0 hung or idle does): the launcher stops rank 0 itself. It
    took that SIGTERM for a stop of the user's, said "nonstop: terminated" and the launch exited 143."""
    with _launch(tmp_path, mode="rank1_fails") as proc:
        pids = _rank_pids(proc, tmp_path, 2)
        _, err = proc.communicate(timeout=60)
        assert not gone_within(pids, 5)
    assert proc.returncode == 1, err
    assert _said(err) == ["nonstop: error: rank 1: failed on purpose"], err
