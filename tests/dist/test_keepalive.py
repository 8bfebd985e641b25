"""Rank 0's keep-alive thread (``ClusterExecutor``): it pings idle ranks, and ``close`` ends it at once, so
no daemon thread is left inside torch when the interpreter finalises (that aborted rank 0 now and then)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from nonstop.engine.distributed import ClusterExecutor


class RecordingComm:
    def __init__(self, timeout: float):
        self.timeout = timeout
        self.sent: list[str] = []
        self.lock = threading.Lock()

    def broadcast_object(self, msg) -> None:
        with self.lock:
            self.sent.append(msg.kind)


def _executor(timeout: float) -> tuple[ClusterExecutor, RecordingComm]:
    comm = RecordingComm(timeout)
    worker = SimpleNamespace(comm=comm, executor=SimpleNamespace(backend="reference"))
    return ClusterExecutor(worker, cfg=None), comm


def test_idle_ranks_get_a_noop_and_close_ends_the_thread_at_once():
    ex, comm = _executor(timeout=2.0)  # pings after 0.5 s idle, wakes every 0.125 s
    deadline = time.monotonic() + 10
    while "noop" not in comm.sent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "noop" in comm.sent
    ex.close()
    assert not ex._keepalive.is_alive() and comm.sent[-1] == "stop"
    ex.close()  # idempotent: no second stop
    assert comm.sent.count("stop") == 1


def test_close_does_not_wait_out_the_keepalive_sleep():
    ex, comm = _executor(timeout=120.0)  # the thread sleeps 7.5 s between checks
    time.sleep(0.1)
    start = time.monotonic()
    ex.close()
    assert time.monotonic() - start < 2.0
    assert not ex._keepalive.is_alive() and comm.sent == ["stop"]
