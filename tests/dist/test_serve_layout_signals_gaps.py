"""``nonstop serve --ep 2`` stopped the ways a service manager and a crash stop it.

A stop signal to the whole process group (systemd's default ``KillMode=control-group``, ``kill -TERM -PGID``)
must drain as the single-process server does: requests in flight finish or end with a clean 503 within the
grace period, exit 143, no rank error. SIGKILL to the launcher alone must take its ranks (and the listening
socket) with it. Every process is started by ``procs.launched`` (its tree is killed whatever happens)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.request

import pytest

from tests.dist.procs import gone_within, launched
from tests.server.in_flight import long_request, wait_until_up


def _serve(port: int) -> list[str]:
    return ["-m", "nonstop", "serve", "--ep", "2", "--port", str(port), "--dist-timeout", "20", "--no-warmup"]


def _rank_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("nonstop:")]


@pytest.mark.timeout(120)
def test_sigterm_to_the_whole_group_drains_like_a_single_process():
    """SIGTERM to the launcher's process group (every rank gets it too) while a request is in flight. The
    followers died of it at once (SIGTERM is SIG_DFL in a follower, ``dist/launch.py`` ``_entry``), so rank
    0's drain failed mid-step: "nonstop: error: rank 0: MoE combine failed ... Connection reset by peer",
    exit 3, and the request in flight got no answer (a stream was cut without an error event or [DONE])."""
    from nonstop.dist.launch import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with launched(_serve(port)) as proc:
        end = time.monotonic() + 90
        wait_until_up(url, proc, end)
        ranks = proc.ranks()
        client, reply = long_request(url, 1500, end)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        client.join(30)
        assert not gone_within(ranks, 5)
    assert not [line for line in _rank_lines(err) if "error" in line], err
    assert proc.returncode == 143, err
    assert "error" not in reply, reply  # the connection was reset: no answer at all
    answer = json.loads(reply["body"])
    assert answer.get("choices") or "shutting down" in answer["error"]["message"], answer
    assert reply["status"] == (200 if answer.get("choices") else 503), reply


@pytest.mark.timeout(120)
def test_sigkill_to_a_serving_launcher_ends_its_ranks_and_frees_the_port():
    """SIGKILL to the launcher alone while a stream is in flight (it cannot stop anything itself): its ranks
    must die with it (``die_with_parent``), the stream's connection closes, and the port is free again.
    Catches ranks (and rank 0's listening socket) left behind by a dead launcher."""
    from nonstop.dist.launch import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    got: list[bytes] = []
    with launched(_serve(port)) as proc:
        end = time.monotonic() + 90
        wait_until_up(url, proc, end)
        ranks = proc.ranks()
        assert len(ranks) == 2, ranks

        def stream() -> None:
            body = {"model": "k3-nano", "prompt": "Hi", "max_tokens": 1900, "ignore_eos": True, "stream": True}
            headers = {"content-type": "application/json"}
            req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), headers)
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    for line in r:
                        got.append(line)
            except OSError:
                got.append(b"<closed>")

        client = threading.Thread(target=stream, daemon=True)
        client.start()
        while sum(line.startswith(b"data:") for line in got) < 3:
            assert time.monotonic() < end and client.is_alive(), got[-3:]
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        left = gone_within(ranks, 5)
        assert not left, f"ranks {left} outlived their launcher by {time.monotonic() - t0:.1f} s"
        client.join(10)
        assert not client.is_alive(), "the stream stayed open after every process of the server died"
    with socket.socket() as s:
        code = s.connect_ex(("127.0.0.1", port))
    assert code != 0, "something still listens on the server's port"
