"""``nonstop serve --ep 2`` over real HTTP answers as the single-process ``nonstop serve`` does: concurrent
chat and completion requests (greedy and seeded sampling, n=3, stop strings, streamed), a stream whose
client leaves midway (its slot is freed and the server goes on), a malformed body (400) and /metrics.
Both servers are processes of their own (``procs.launched``: their trees are killed whatever happens)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.dist.procs import gone_within, launched
from tests.server.in_flight import wait_until_up

M = {"model": "k3-nano"}
C, CHAT = "/v1/completions", "/v1/chat/completions"


def _chat(content: str) -> dict:
    return {**M, "messages": [{"role": "user", "content": content}]}


REQUESTS = [
    (C, {**M, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0, "seed": 123, "n": 3}),
    (C, {**M, "prompt": "The Python interpreter", "max_tokens": 30, "temperature": 0, "stop": [" the"]}),
    (CHAT, {**_chat("Hello"), "max_tokens": 8, "temperature": 0}),
    (CHAT, {**_chat("A story"), "max_tokens": 8, "seed": 5}),
    (C, {**M, "prompt": "The Python", "max_tokens": 8, "temperature": 0.8, "seed": 3, "stream": True}),
    (CHAT, {**_chat("Hi"), "max_tokens": 6, "n": 2, "seed": 1, "stream": True}),
]


def _post(url: str, path: str, body: dict):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read().decode()
    if not body.get("stream"):
        choices = json.loads(raw)["choices"]
        return sorted((c["index"], c.get("text") or c["message"]["content"], c["finish_reason"]) for c in choices)
    texts: dict[int, str] = {}
    events = [line[5:].strip() for line in raw.splitlines() if line.startswith("data:")]
    assert events[-1] == "[DONE]", events[-3:]
    for event in events[:-1]:
        for c in json.loads(event)["choices"]:
            piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
            texts[c["index"]] = texts.get(c["index"], "") + (piece or "")
    return sorted(texts.items())


def _leave_a_stream(url: str, events: int = 3) -> None:
    """A streamed completion whose client closes the connection after ``events`` events."""
    host, port = url.rsplit("/", 1)[1].split(":")
    body = json.dumps({**M, "prompt": "Hi", "max_tokens": 1500, "ignore_eos": True, "stream": True}).encode()
    with socket.create_connection((host, int(port)), timeout=60) as s:
        head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(body)}"
        s.sendall(head.encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data:") < events:
            chunk = s.recv(4096)
            assert chunk, got
            got += chunk


def _health(url: str) -> dict:
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.timeout(150)
def test_ep2_server_answers_every_kind_of_request_like_a_single_process_server():
    """Concurrent requests to an ``--ep 2`` server and a single-process one give the same choices (seeded
    sampling with n=3, a stop string cut before it, chat, streams with n=2); a client that leaves a stream
    midway frees its slot (/health back to 0 active) and the next requests still agree; a malformed body is
    a 400; /metrics counts the aborted stream. Catches a layout whose sampling, stops, streams, slot reuse
    or cancellation differ from one process's."""
    from nonstop.dist.launch import free_port

    p_ep, p_one = free_port(), free_port()
    ep_url, one_url = f"http://127.0.0.1:{p_ep}", f"http://127.0.0.1:{p_one}"
    common = ["--no-warmup", "--max-batch", "3"]
    with (
        launched(["-m", "nonstop", "serve", "--ep", "2", "--port", str(p_ep), "--dist-timeout", "30", *common]) as ep,
        launched(["-m", "nonstop", "serve", "--port", str(p_one), "--backend", "reference", *common]) as one,
    ):
        end = time.monotonic() + 100
        wait_until_up(ep_url, ep, end)
        wait_until_up(one_url, one, end)
        ranks = ep.ranks()
        with ThreadPoolExecutor(2 * len(REQUESTS)) as pool:
            futs = [(pool.submit(_post, ep_url, *r), pool.submit(_post, one_url, *r)) for r in REQUESTS]
            results = [(a.result(), b.result()) for a, b in futs]
        for (path, body), (got, want) in zip(REQUESTS, results):
            assert got == want, (path, body)
        (_, cut, reason) = results[1][0][0]
        assert reason == "stop" and " the" not in cut, results[1][0]
        assert len({text for _, text, _ in results[0][0]}) > 1, results[0][0]  # n=3 sampled, not copied
        _leave_a_stream(ep_url)
        while _health(ep_url)["active_sequences"]:
            assert time.monotonic() < end, "the left stream kept its slot"
            time.sleep(0.1)
        again = _post(ep_url, *REQUESTS[0])
        assert again == results[0][1]
        bad = urllib.request.Request(ep_url + "/v1/completions", b"{not json", {"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(bad, timeout=30)
        assert err.value.code == 400 and "not valid JSON" in err.value.read().decode()
        with urllib.request.urlopen(ep_url + "/metrics", timeout=10) as r:
            metrics = r.read().decode().splitlines()
        aborts = [line for line in metrics if line.startswith('nonstop_request_finish_total{reason="abort"}')]
        assert aborts and float(aborts[0].split()[-1]) >= 1, metrics
        os.kill(ep.pid, signal.SIGINT)
        ep.communicate(timeout=60)
        assert ep.returncode == 0
        assert not gone_within(ranks, 5)
