"""A burst of mixed calls at once against the real ``nonstop serve`` process (the session's ``server``
fixture: batch-invariant by default): completions and chat, whole and streamed, n > 1, several
``max_tokens``, greedy and seeded sampling. Every call must get exactly what it gets alone, its usage and
finish reasons must be right by hand count, and /metrics must move by exactly the burst's hand count."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.server.conftest import MODEL_NAME

pytestmark = pytest.mark.timeout(180)

PROMPTS = ["The interpreter", "A list is", "def f(x):", "Modules"]


def _calls() -> list[tuple[str, dict]]:
    """16 calls, each (route, body); every one runs to max_tokens (ignore_eos), so finish is ``length``."""
    calls = []
    for i in range(16):
        chat = i % 2 == 1
        body: dict = {
            "model": MODEL_NAME,
            "max_tokens": (1, 4, 9, 13)[i % 4],
            "ignore_eos": True,
        }
        body |= {"temperature": 0} if i % 3 == 0 else {"temperature": 0.9, "seed": 100 + i}
        if i % 5 == 2:
            body["n"] = 2 + i % 2
        if i % 4 >= 2:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        if chat:
            body["messages"] = [{"role": "user", "content": PROMPTS[i % 4]}]
        else:
            body["prompt"] = PROMPTS[i % 4]
        calls.append(("/v1/chat/completions" if chat else "/v1/completions", body))
    return calls


def _outcome(route: str, response: httpx.Response) -> tuple[list[str], list[str], dict]:
    """(each choice's text, each choice's finish reason, usage) of a whole or streamed response."""
    assert response.status_code == 200, response.text
    chat = route.endswith("chat/completions")
    if not response.headers["content-type"].startswith("text/event-stream"):
        body = response.json()
        choices = sorted(body["choices"], key=lambda c: c["index"])
        texts = [c["message"]["content"] if chat else c["text"] for c in choices]
        return texts, [c["finish_reason"] for c in choices], body["usage"]
    events = [line[6:] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    usage = None
    for chunk in map(json.loads, events[:-1]):
        usage = chunk.get("usage") or usage
        for c in chunk["choices"]:
            piece = c["delta"].get("content") if chat else c["text"]
            texts[c["index"]] = texts.get(c["index"], "") + (piece or "")
            if c["finish_reason"] is not None:
                assert c["index"] not in reasons, "a choice finished twice"
                reasons[c["index"]] = c["finish_reason"]
    return (
        [texts[k] for k in sorted(texts)],
        [reasons.get(k) for k in sorted(texts)],
        usage,
    )


def _metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_a_mixed_burst_gets_the_solo_answers_with_hand_counted_usage_and_metrics(
    server,
):
    """Catches a call's tokens depending on what else runs (batch invariance broken, a seed's noise keyed
    by batch row, a choice's events delivered to another call), usage or finish reasons wrong under load,
    and /metrics counters that do not move by exactly the calls, completions and tokens sent."""
    calls = _calls()
    with httpx.Client(timeout=120) as http:
        solo = [_outcome(route, http.post(server.url + route, json=body)) for route, body in calls]
    assert server.wait_idle() == 0
    before = _metrics(server.url)
    start = threading.Barrier(len(calls))

    def send(call):
        route, body = call
        with httpx.Client(timeout=120) as http:
            start.wait(30)
            return _outcome(route, http.post(server.url + route, json=body))

    with ThreadPoolExecutor(len(calls)) as pool:
        together = list(pool.map(send, calls))
    assert server.wait_idle() == 0
    completions = sum(body.get("n", 1) for _, body in calls)
    server.wait_metric(
        'nonstop_request_finish_total{reason="length"}',
        before.get('nonstop_request_finish_total{reason="length"}', 0) + completions,
    )
    after = _metrics(server.url)

    for (route, body), alone, burst in zip(calls, solo, together):
        assert burst == alone, (route, body)
        texts, reasons, usage = burst
        n = body.get("n", 1)
        assert len(texts) == n and reasons == ["length"] * n, (body, reasons)
        assert usage["completion_tokens"] == n * body["max_tokens"], (body, usage)
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    def moved(key: str) -> float:
        return after.get(key, 0) - before.get(key, 0)

    for route in ("/v1/completions", "/v1/chat/completions"):
        sent = sum(1 for r, _ in calls if r == route)
        assert moved(f'nonstop_requests_total{{endpoint="{route}",status="200"}}') == sent, route
    assert moved('nonstop_request_finish_total{reason="length"}') == completions
    assert moved('nonstop_request_finish_total{reason="abort"}') == 0
    assert moved("nonstop_generation_tokens_total") == sum(b.get("n", 1) * b["max_tokens"] for _, b in calls)
    assert moved("nonstop_time_to_first_token_seconds_count") == completions
    assert moved("nonstop_request_latency_seconds_count") == completions
