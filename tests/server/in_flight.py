"""A served model with a long request in flight, for the tests that stop a server under it
(``tests/server/test_shutdown.py``, ``tests/dist/test_launch_stops.py``), and an engine that never answers, for
the tests of a submission's cancellation."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request


def get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def active(url: str) -> float:
    """The server's sequences holding a slot (/metrics)."""
    lines = get(url + "/metrics").decode().splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith("nonstop_active_sequences "))


def wait_until_up(url: str, proc, deadline: float) -> None:
    """Poll /health until it answers; fail when ``proc`` ends or ``deadline`` (monotonic) passes."""
    while True:
        try:
            get(url + "/health", 2)
            return
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None, "the server did not come up"
            time.sleep(0.3)


def long_request(url: str, max_tokens: int, deadline: float) -> tuple[threading.Thread, dict]:
    """Send a greedy k3-nano completion of ``max_tokens`` tokens from a thread and return once the server
    holds it in a slot: (the thread, its reply: ``status`` and ``body``, or ``error`` when the connection
    failed)."""
    reply: dict = {}

    def ask() -> None:
        body = {"model": "k3-nano", "prompt": "The", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
        headers = {"content-type": "application/json"}
        req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), headers)
        try:
            reply["status"], reply["body"] = 200, urllib.request.urlopen(req, timeout=120).read()
        except urllib.error.HTTPError as exc:
            reply["status"], reply["body"] = exc.code, exc.read()
        except OSError as exc:
            reply["error"] = repr(exc)

    client = threading.Thread(target=ask, daemon=True)
    client.start()
    while not active(url):
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.1)
    return client, reply


class SilentEngine:
    """An engine that accepts requests and never produces an event; records the ids it is asked to cancel."""

    max_waiting = 8
    num_slots = 0

    def __init__(self):
        self.cancelled: list[str] = []

    def submit(self, req, sink) -> None:
        pass

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)
