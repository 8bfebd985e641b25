"""Stopping a real ``nonstop serve`` (tiny K3, reference backend, no warmup) with SIGTERM / SIGINT: an idle
server exits at once and cleanly, and a client still sending its request body when the stop comes is
answered cleanly too (no task cancelled under it, no traceback in the log, no bare text/plain 500). Each
server process is killed in ``finally`` whatever happens."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from urllib.parse import urlsplit

import pytest

from tests.server.conftest import start_server

pytestmark = pytest.mark.timeout(180)


def _started(model_dir, tmp_path):
    return start_server(model_dir, tmp_path, "--backend", "reference", "--no-warmup", "--log-level", "info")


def _stop(server, sig) -> tuple[int | None, float]:
    """Send ``sig``; (exit status or None when it did not exit within 60 s, seconds it took)."""
    t0 = time.monotonic()
    server.process.send_signal(sig)
    try:
        return server.process.wait(60), time.monotonic() - t0
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - t0


def _kill(server) -> None:
    if server.process.poll() is None:
        server.process.kill()
        server.process.wait(10)


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 0)])
def test_an_idle_server_exits_promptly_and_cleanly_on_a_stop_signal(model_dir, tmp_path, sig, status):
    """Catches a stop signal that leaves the process running (or waiting out the grace period with nothing
    in flight), a wrong exit status for a supervisor (143 for SIGTERM, 0 for Ctrl-C) or a traceback on a
    plain stop, even with an idle keep-alive connection open."""
    server = _started(model_dir, tmp_path)
    try:
        host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
        idle = socket.create_connection((host, port), timeout=10)  # keep-alive, idle after one request
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert idle.recv(4096).startswith(b"HTTP/1.1 200")
        code, took = _stop(server, sig)
        idle.close()
        log = server.log.read_text()
        assert code == status, log
        assert took < 5.0, f"idle server took {took:.1f} s to exit"
        assert "Traceback" not in log, log
    finally:
        _kill(server)


def test_a_client_still_sending_its_body_at_shutdown_gets_a_clean_answer(model_dir, tmp_path):
    """A client that has sent its headers and part of its body when SIGTERM comes is answered once the grace
    period (``launch.GRACE_S``) is over: a JSON 503 ``server_shutting_down`` with ``Connection: close``, and
    the server exits with 143. Its handler waited on the body, not the engine, so uvicorn once cancelled it when
    ``timeout_graceful_shutdown`` ran out (5 s later): a ``CancelledError`` traceback in the log and a bare
    text/plain 500 for the client."""
    from nonstop.server.launch import GRACE_S

    server = _started(model_dir, tmp_path)
    try:
        host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
        slow = socket.create_connection((host, port), timeout=60)
        slow.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model"'
        )
        time.sleep(0.5)  # the handler is waiting for the rest of the body
        t0 = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        reply = slow.recv(4096)  # the client's wait, timed (the process's own exit slows under a busy machine)
        answered = time.monotonic() - t0
        while chunk := slow.recv(4096):  # the rest (the body may come in a later segment), to the close
            reply += chunk
        slow.close()
        code = server.process.wait(60)
        log = server.log.read_text()
        assert code == 143, log
        assert "Traceback" not in log and "CancelledError" not in log, log
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), reply
        assert b"application/json" in head.lower() and b"connection: close" in head.lower(), reply
        assert b'"server_shutting_down"' in body, reply
        assert answered < GRACE_S + 3, f"the client was answered {answered:.1f} s after the stop"
    finally:
        _kill(server)
