"""Continuous batching through HTTP: concurrent greedy == sequential, and cancelled streams free slots."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from tests.server.conftest import MODEL_NAME

PROMPTS = [f"Request {i}: " + "abcdefghij"[: i % 7] for i in range(24)]


def _greedy(client, prompt: str):
    out = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0, logprobs=0)
    choice = out.choices[0]
    return choice.text, choice.logprobs.tokens, choice.logprobs.token_logprobs, choice.finish_reason


def test_concurrent_greedy_completions_equal_sequential(server):
    client = server.client()
    sequential = [_greedy(client, p) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        concurrent = list(pool.map(lambda p: _greedy(client, p), PROMPTS))
    assert concurrent == sequential  # bit-identical logprobs too
    assert server.wait_idle() == 0


def test_cancelled_streams_free_their_slots(server):
    client = server.client()
    aborted_before = server.metric('nonstop_request_finish_total{reason="abort"}')
    for round_ in range(3):
        streams = [
            client.chat.completions.create(
                model=MODEL_NAME,
                messages=[{"role": "user", "content": f"cancel me {round_}.{i}"}],
                max_tokens=200,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            for i in range(6)
        ]
        for s in streams:
            for n, _ in enumerate(s):
                if n == 2:
                    break
            s.close()
    assert server.wait_idle() == 0
    assert (
        server.wait_metric('nonstop_request_finish_total{reason="abort"}', aborted_before + 18) - aborted_before == 18
    )
    assert server.healthy()
    after = client.completions.create(model=MODEL_NAME, prompt="still serving", max_tokens=2, temperature=0)
    assert after.choices[0].finish_reason == "length"


def test_a_client_that_stops_waiting_for_a_whole_response_frees_its_slot(server):
    """A client that sends a non-streamed request and closes its connection while the request decodes: the
    server aborts it (counted as an abort) and frees the slot. The connection is closed once the request holds
    a slot (a client read timeout could fire before a loaded server had admitted it, which then never ran)."""
    aborted = 'nonstop_request_finish_total{reason="abort"}'
    aborted_before = server.metric(aborted)
    body = json.dumps(
        {"model": MODEL_NAME, "prompt": "slow", "max_tokens": 240, "temperature": 0, "ignore_eos": True}
    ).encode()
    url = urlsplit(server.api + "/completions")
    head = (
        f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(head + body)
        deadline = time.monotonic() + 20
        while server.metric("nonstop_active_sequences") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.metric("nonstop_active_sequences") >= 1, "the request never started decoding"
    assert server.wait_idle() == 0
    assert server.wait_metric(aborted, aborted_before + 1) == aborted_before + 1  # cut short, not run to the end
