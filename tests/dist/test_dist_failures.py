"""A rank that dies or hangs ends every rank with a clear error in bounded time; Ctrl-C stops all ranks;
the CLI starts the ranks itself and prints the single-process tokens."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nonstop.dist.launch import RankExited, spawn
from tests.dist.workers import failing_rank

TIMEOUT = 5.0  # collective timeout of these runs
ROOT = Path(__file__).resolve().parents[2]


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


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


def _rank_pids(pid: int) -> list[int]:
    """The rank processes the launcher ``pid`` spawned (not multiprocessing's resource tracker)."""
    ranks = []
    for c in _children(pid):
        try:
            cmd = Path(f"/proc/{c}/cmdline").read_bytes()
        except OSError:
            continue
        if b"resource_tracker" not in cmd:
            ranks.append(c)
    return sorted(ranks)


def _cli(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "nonstop", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _wait_ranks(proc: subprocess.Popen, n: int, deadline: float = 120) -> list[int]:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        pids = _rank_pids(proc.pid)
        if len(pids) >= n:
            time.sleep(8)  # let them load and start decoding
            return _rank_pids(proc.pid)
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the ranks did not start")


def test_cli_generate_under_a_layout_prints_the_single_process_tokens():
    common = ["generate", "--prompt-ids", "5,6,7", "-n", "8", "--temperature", "0", "--ids", "--dist-timeout", "30"]
    single = subprocess.run(
        [sys.executable, "-m", "nonstop", *common],
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    multi = _cli(*common, "--tp", "2", "--ep", "2")
    out, err = multi.communicate(timeout=300)
    assert single.returncode == 0 and multi.returncode == 0, err
    ids = [line for line in single.stdout.splitlines() if line.startswith("token ids:")]
    assert ids and ids == [line for line in out.splitlines() if line.startswith("token ids:")]
    assert "starting 2 local ranks" in err


def test_cli_killed_rank_ends_the_run_with_a_clear_error():
    proc = _cli("generate", "--prompt-ids", "5,6,7", "-n", "2000", "--ignore-eos", "--ep", "2", "--dist-timeout", "10")
    ranks = _wait_ranks(proc, 2)
    os.kill(ranks[-1], signal.SIGKILL)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 30
    assert proc.returncode not in (0, None)
    assert "nonstop: error:" in err and "rank" in err
    assert not any(
        Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        for p in ranks
    )


def test_ctrl_c_stops_every_rank():
    proc = _cli(
        "generate",
        "--prompt-ids",
        "5,6,7",
        "-n",
        "2000",
        "--ignore-eos",
        "--ep",
        "2",
        "--dist-timeout",
        "10",
        start_new_session=True,
    )
    ranks = _wait_ranks(proc, 2)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: SIGINT to the whole process group
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 30
    assert proc.returncode != 0 and "interrupted" in err
    time.sleep(1)
    assert not [p for p in ranks if Path(f"/proc/{p}").exists()]


def test_cli_serve_under_a_layout_answers_like_a_single_process():
    import json
    import socket
    import urllib.request

    from nonstop.engine.llm import LLM

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _cli("serve", "--ep", "2", "--port", str(port), "--dist-timeout", "20", start_new_session=True)
    try:
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
        ranks = _rank_pids(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=60)
    time.sleep(1)
    assert not [p for p in ranks if Path(f"/proc/{p}").exists()]
