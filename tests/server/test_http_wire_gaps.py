"""Black-box HTTP behaviour of a real ``nonstop serve`` (the session ``server`` of conftest: tiny K3, 16
slots) probed as a demanding client would: stop strings that span tokens (whole and streamed agree with the
text cut at the first match), seeded sampling under concurrent load with clients vanishing mid-stream
(every survivor gets the tokens it gets alone), and raw-socket HTTP details (``Expect: 100-continue``, a
chunked body, the keep-alive connection still usable after a 400)."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.server.conftest import MODEL_NAME

pytestmark = pytest.mark.timeout(180)


def _post(server, path: str, body: dict) -> dict:
    r = httpx.post(server.url + path, json={"model": MODEL_NAME, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _sse(server, path: str, body: dict) -> list[dict]:
    """Every event of a stream, checked to be ``data: <json>`` and to end with ``data: [DONE]``."""
    r = httpx.post(server.url + path, json={"model": MODEL_NAME, "stream": True, **body}, timeout=60)
    assert r.status_code == 200, r.text
    events = [e for e in r.text.split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events), r.text
    assert events[-1] == "data: [DONE]", r.text
    return [json.loads(e[len("data: ") :]) for e in events[:-1]]


def _streamed_text(events: list[dict], chat: bool) -> tuple[str, str | None]:
    text, reason = "", None
    for event in events:
        for choice in event["choices"]:
            text += choice["delta"].get("content", "") if chat else choice["text"]
            reason = choice["finish_reason"] or reason
    return text, reason


def _raw(server, data: bytes, timeout: float = 30) -> bytes:
    """Send ``data`` on one connection and read until the server closes it."""
    url = urlsplit(server.url)
    with socket.create_connection((url.hostname, url.port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_a_stop_string_spanning_two_tokens_cuts_whole_and_streamed_text_alike(server):
    """Catches a stop string matched per token only (one that starts inside one token and ends inside the
    next goes unseen), streamed text that leaks the held-back part of the stop string, or a finish_reason
    other than ``stop``: expected text is the greedy text cut at the stop string's first occurrence."""
    base = {"prompt": "Hello there", "max_tokens": 12, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    full = _post(server, "/v1/completions", base)["choices"][0]
    text, offsets, tokens = full["text"], full["logprobs"]["text_offset"], full["logprobs"]["tokens"]
    # the last character of one multi-character token and the first of the next
    k = next(i for i in range(1, len(tokens) - 1) if offsets[i - 1] < offsets[i] < offsets[i + 1])
    stop = text[offsets[k] - 1 : offsets[k] + 1]
    assert len(stop) == 2
    want = text[: text.find(stop)]
    body = {**base, "stop": [stop]}
    whole = _post(server, "/v1/completions", body)["choices"][0]
    assert (whole["text"], whole["finish_reason"]) == (want, "stop")
    assert _streamed_text(_sse(server, "/v1/completions", body), chat=False) == (want, "stop")


def _vanish(server) -> None:
    """A client that starts a long stream, reads its first bytes and closes the socket at a random moment."""
    url = urlsplit(server.url)
    body = json.dumps({"model": MODEL_NAME, "prompt": "vanish", "max_tokens": 200, "stream": True}).encode()
    with socket.create_connection((url.hostname, url.port), timeout=30) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\n\r\n" % len(body)
            + body
        )
        s.recv(1024)
        time.sleep(random.random() * 0.3)


def test_seeded_sampled_streams_equal_their_solo_runs_while_other_clients_vanish(server):
    """Catches per-request seeded sampling that depends on what else runs (shared generator state, a batch
    position in the noise), a vanished client's cancellation reaching another request, or a slot not freed:
    12 seeded chat streams at temperature 1, run at once beside 6 clients that hang up mid-stream, must each
    equal the same request run alone, and the server must end idle."""
    bodies = [
        {"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 12, "temperature": 1.0, "seed": i}
        for i in range(12)
    ]
    alone = [_streamed_text(_sse(server, "/v1/chat/completions", b), chat=True) for b in bodies]
    together: dict[int, tuple] = {}

    def ask(i: int) -> None:
        together[i] = _streamed_text(_sse(server, "/v1/chat/completions", bodies[i]), chat=True)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(12)]
    threads += [threading.Thread(target=_vanish, args=(server,)) for _ in range(6)]
    random.Random(0).shuffle(threads)
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [together.get(i) for i in range(12)] == alone
    assert server.wait_idle() == 0
    assert server.healthy()


def test_expect_100_continue_and_a_chunked_body_are_served(server):
    """Catches a body reader that needs Content-Length (a chunked upload, as curl sends from stdin) or that
    never triggers the interim 100 Continue a client sent ``Expect: 100-continue`` waits for."""
    body = json.dumps({"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, "temperature": 0}).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
    out = _raw(server, head + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert out.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200"), out
    chunked = head + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    out = _raw(server, chunked)
    assert out.startswith(b"HTTP/1.1 200"), out
    assert json.loads(out.partition(b"\r\n\r\n")[2])["usage"]["completion_tokens"] == 2


def test_the_connection_stays_usable_after_a_malformed_body(server):
    """Catches an invalid-JSON 400 that closes (or desynchronises) the keep-alive connection: a second
    request pipelined on it must get its own 200."""
    bad = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 3\r\n\r\n{x}"
    body = json.dumps({"model": MODEL_NAME, "prompt": "hi", "max_tokens": 1}).encode()
    good = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    out = _raw(server, bad + good)
    first, _, rest = out.partition(b"HTTP/1.1 200")
    assert first.startswith(b"HTTP/1.1 400"), out
    assert b'"code":"invalid_json"' in first, out
    assert b'"text_completion"' in rest, out
