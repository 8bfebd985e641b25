"""A rank that dies or hangs ends every rank with a clear error in bounded time; Ctrl-C stops all ranks;
a launcher killed outright takes its ranks with it; the CLI starts the ranks itself and prints the
single-process tokens. Every CLI run is started by ``procs.launched``: its process tree is killed
whatever happens."""

from __future__ import annotations

import os
import pickle
import signal
import time

import pytest

from nonstop.dist.launch import RankExited, spawn
from tests.dist.procs import alive, gone_within, launched, wait_started
from tests.dist.workers import failing_rank

TIMEOUT = 5.0  # collective timeout of these runs


@pytest.mark.parametrize("mode", ["exit", "hang", "idle_exit", "rank0_hang"])
def test_a_dead_or_hung_rank_is_noticed_in_bounded_time(tmp_path, mode):
    try:
        spawn(failing_rank, 2, (str(tmp_path), "k3-nano", mode, TIMEOUT), timeout=120)
    except RankExited as exc:
        assert mode == "rank0_hang" and exc.rank == 0  # rank 1 killed the frozen rank 0
    result = pickle.loads((tmp_path / "result.pkl").read_bytes())
    assert result["error"] is not None, "the failure went unnoticed"
    assert "another rank has died, hung" in result["error"]
    bound = {"exit": 5.0, "hang": TIMEOUT + 10, "idle_exit": TIMEOUT + 10, "rank0_hang": TIMEOUT + 10}[mode]
    assert result["seconds"] < bound, result


def test_cli_generate_under_a_layout_prints_the_single_process_tokens():
    common = ["generate", "--prompt-ids", "5,6,7", "-n", "8", "--temperature", "0", "--ids"]
    with launched(["-m", "nonstop", *common]) as single:
        single_out, _ = single.communicate(timeout=300)
    with launched(["-m", "nonstop", *common, "--tp", "2", "--ep", "2", "--dist-timeout", "30"]) as multi:
        out, err = multi.communicate(timeout=300)
    assert single.returncode == 0 and multi.returncode == 0, err
    ids = [line for line in single_out.splitlines() if line.startswith("token ids:")]
    assert ids and ids == [line for line in out.splitlines() if line.startswith("token ids:")]
    assert "starting 2 local ranks" in err


LONG = ["-m", "nonstop", "generate", "--prompt-ids", "5,6,7", "-n", "2000", "--ignore-eos", "--ep", "2"]


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "nonstop: error" in line]


@pytest.mark.parametrize("world", [2, 3])
def test_cli_killed_rank_ends_the_run_with_one_line_naming_it(world):
    """README: "a rank that dies or hangs stops every rank with a one-line error". The ranks whose
    collectives failed each printed a line ("another rank has died, hung ... or failed") before the
    launcher's, the only one naming the cause: 2 lines at world 2, 3 at world 3 (sometimes two run together
    on one line)."""
    with launched([*LONG[:-1], str(world), "--dist-timeout", "10"]) as proc:
        ranks = wait_started(proc, world)
        os.kill(ranks[-1], signal.SIGKILL)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - t0 < 30
        assert proc.returncode not in (0, None)
        assert not gone_within(ranks, 5)
    assert _error_lines(err) == [
        f"nonstop: error: rank {world - 1} was killed by SIGKILL (the first rank to end); the other ranks were stopped"
    ], err
    assert "Traceback" not in err


def test_cli_hung_rank_ends_the_run_with_one_line():
    """A rank that hangs (stopped, not dead): no rank ends by a signal, so the line is a failed collective's,
    left by the first rank to meet it and printed once by the launcher."""
    with launched([*LONG, "--dist-timeout", "5"]) as proc:
        ranks = wait_started(proc, 2)
        os.kill(ranks[-1], signal.SIGSTOP)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=90)
        assert time.monotonic() - t0 < 60
        assert proc.returncode == 3, err
        assert not gone_within(ranks, 5)
    lines = _error_lines(err)
    assert len(lines) == 1 and lines[0].startswith("nonstop: error: rank 0: "), err
    assert "hung past the 5 s collective timeout" in lines[0], err


def test_ctrl_c_stops_every_rank():
    with launched([*LONG, "--dist-timeout", "10"]) as proc:
        ranks = wait_started(proc, 2)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: SIGINT to the whole process group
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - t0 < 30
        assert proc.returncode == 130, err
        # one line (rank 0's; the launcher's own "interrupted; all ranks stopped" was a second one), and
        # the followers, told a stop was coming, do not report rank 0 leaving mid-step as an error
        assert err.count("nonstop: interrupted") == 1 and "nonstop: error" not in err, err
        assert not gone_within(ranks, 5)


def test_ranks_end_when_their_launcher_is_killed():
    """SIGKILL to the launcher alone (it cannot stop anything): its ranks die with it (PR_SET_PDEATHSIG)."""
    with launched([*LONG, "--dist-timeout", "60"]) as proc:
        ranks = wait_started(proc, 2)
        assert len(ranks) == 2 and all(alive(p) for p in ranks)
        os.kill(proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        left = gone_within(ranks, 10)
        assert not left, f"ranks {left} outlived their launcher by {time.monotonic() - t0:.1f} s"


def test_cli_serve_under_a_layout_answers_like_a_single_process():
    import json
    import urllib.request

    from nonstop.dist.launch import free_port
    from nonstop.engine.llm import LLM

    port = free_port()
    with launched(["-m", "nonstop", "serve", "--ep", "2", "--port", str(port), "--dist-timeout", "20"]) as proc:
        url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < end and proc.poll() is None, "the server did not come up"
                time.sleep(0.5)
        body = json.dumps(
            {"model": "k3-nano", "prompt": "The Python interpreter", "max_tokens": 10, "temperature": 0}
        ).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
        text = json.loads(urllib.request.urlopen(req, timeout=120).read())["choices"][0]["text"]
        single = LLM("k3-nano")  # the server samples with the checkpoint's defaults under the request's fields
        expected = single.generate(["The Python interpreter"], single.default_sampling(max_tokens=10, temperature=0))[
            0
        ].text
        assert text == expected
        ranks = proc.ranks()
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=60)
        assert not gone_within(ranks, 5)
