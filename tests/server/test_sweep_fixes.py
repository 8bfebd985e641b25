"""Defects a tester found against ``nonstop serve``, each with the input that showed it: streamed
``text_offset`` behind held-back stop text, a large whole response built on the event loop, a client
that leaves mid-upload counted as a 500, ``stream_options`` without ``stream``, and ``usage: null`` on
the chunks of an include_usage stream."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time

import httpx
import pytest

from nonstop.engine.llm import LLM
from nonstop.server import build_context
from nonstop.server.responses import ResponseBuilder
from tests.server.conftest import MODEL_NAME
from tests.server.inprocess import serve_in_thread


def _post(url: str, body: dict) -> httpx.Response:
    return httpx.post(url, json=body, timeout=60)


def _events(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    lines = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def _on_event_loop() -> bool:
    """Whether the calling thread is running an asyncio event loop."""
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, dtype="float32", max_batch=4)


# ------------------------------------------------------------------ streamed text_offset


@pytest.mark.parametrize("echo", [False, True])
def test_streamed_text_offsets_equal_the_whole_responses_when_stop_strings_hold_text_back(server, echo):
    """Each stop string is a piece of the greedy text followed by a character it never has, so the engine
    holds that piece back (it could start the stop string) and then lets it go: the streamed offsets
    counted only the characters sent so far."""
    body = {"model": MODEL_NAME, "prompt": "The sea", "temperature": 0, "max_tokens": 24, "ignore_eos": True}
    text = _post(server.api + "/completions", body).json()["choices"][0]["text"]
    absent = next(c for c in "\x07~§¤" if c not in text)
    stops = [text[2:6] + absent, text[9:12] + absent]
    asked = {**body, "logprobs": 0, "stop": stops, "echo": echo}
    whole = _post(server.api + "/completions", asked).json()["choices"][0]
    assert whole["text"].removeprefix("The sea" if echo else "") == text  # no stop string matched
    chunks = [e["choices"][0] for e in _events(_post(server.api + "/completions", {**asked, "stream": True}))]
    assert any(c["logprobs"] and c["logprobs"]["tokens"] and not c["text"] for c in chunks)  # text was held back
    streamed = [o for c in chunks if c["logprobs"] for o in c["logprobs"]["text_offset"]]
    assert streamed == whole["logprobs"]["text_offset"]
    assert "".join(c["text"] for c in chunks) == whole["text"]


# ------------------------------------------------------------------ a large whole response


def test_a_whole_response_is_built_and_rendered_off_the_event_loop(llm, monkeypatch):
    """n x an echoed prompt x 20 top logprobs makes megabytes of JSON: building it on the loop stalled
    every stream and /health for seconds."""
    import nonstop.server.app as app_module

    seen = []
    real_body = ResponseBuilder.body

    def body(self, *args, **kw):
        seen.append(("body", _on_event_loop()))
        return real_body(self, *args, **kw)

    class RecordingResponse(app_module.JSONResponse):
        def render(self, content) -> bytes:
            seen.append(("render", _on_event_loop()))
            return super().render(content)

    monkeypatch.setattr(ResponseBuilder, "body", body)
    monkeypatch.setattr(app_module, "JSONResponse", RecordingResponse)
    with serve_in_thread(build_context(llm, [MODEL_NAME], max_batch=4)) as url:
        asked = {"model": MODEL_NAME, "prompt": [5] * 40, "n": 4, "max_tokens": 0, "echo": True, "logprobs": 20}
        r = _post(url + "/v1/completions", asked)
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 4
    assert seen == [("body", False), ("render", False)]


# ------------------------------------------------------------------ a client that leaves mid-upload


def test_a_client_that_leaves_while_sending_its_body_is_a_499_not_an_error(llm, caplog):
    ctx = build_context(llm, [MODEL_NAME], max_batch=2)
    with serve_in_thread(ctx) as url, caplog.at_level(logging.WARNING):
        port = int(url.rsplit(":", 1)[1])
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(head + b'Content-Length: 1000\r\n\r\n{"model"')
            time.sleep(0.2)
        left = 'nonstop_requests_total{endpoint="/v1/chat/completions",status="499"} 1'
        deadline = time.monotonic() + 10
        while left not in (metrics := httpx.get(url + "/metrics").text) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left in metrics
        assert 'status="500"' not in metrics
        assert httpx.get(url + "/health").status_code == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


# ------------------------------------------------------------------ stream_options and usage


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_stream_options_without_stream_is_a_400_naming_it(server, path):
    body = {"model": MODEL_NAME, "max_tokens": 2, "stream_options": {"include_usage": True}}
    body |= {"prompt": "a"} if path == "/completions" else {"messages": [{"role": "user", "content": "a"}]}
    for stream in ({}, {"stream": False}):
        r = _post(server.api + path, {**body, **stream})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "stream_options"
    assert _post(server.api + path, {**body, "stream": True}).status_code == 200


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_include_usage_sends_usage_null_on_every_chunk_but_the_last(server, path):
    body = {"model": MODEL_NAME, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": True}
    chat = {"messages": [{"role": "user", "content": "a"}]}
    body |= {"prompt": "a", "echo": True} if path == "/completions" else chat
    events = _events(_post(server.api + path, {**body, "stream_options": {"include_usage": True}}))
    assert len(events) > 2
    assert all("usage" in e and e["usage"] is None for e in events[:-1])
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 4
    assert not any("usage" in e for e in _events(_post(server.api + path, body)))  # not asked: no key


# ------------------------------------------------------------------ tokens inside a character


def _token_bytes(listed: str) -> bytes:
    """A listed token's bytes: ``bytes:\\xe6\\x97`` or its text."""
    return bytes.fromhex(listed[len("bytes:") :].replace("\\x", "")) if listed.startswith("bytes:") else listed.encode()


def test_logprobs_name_the_bytes_of_tokens_inside_a_character_and_offsets_follow_the_text():
    """k3-nano's byte-level BPE splits 日本語🙂 into 13 single-byte tokens: they were all listed as U+FFFD
    (sharing one top_logprobs key) and each moved text_offset on by one character, past the text's end.
    A token's offset is the number of whole characters before its first byte."""
    prompt = "日本語🙂 ok"
    ctx = build_context(LLM("k3-nano", dtype="float32", max_batch=2), ["k3-nano"], max_batch=2)
    with serve_in_thread(ctx) as url:
        body = {"model": "k3-nano", "prompt": prompt, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 5}
        whole = _post(url + "/v1/completions", body).json()["choices"][0]
        chunks = [e["choices"][0] for e in _events(_post(url + "/v1/completions", {**body, "stream": True}))]
    lp = whole["logprobs"]
    raw = [_token_bytes(t) for t in lp["tokens"]]
    assert b"".join(raw).decode("utf-8", errors="replace").startswith(prompt)
    assert sum(t.startswith("bytes:\\x") for t in lp["tokens"]) >= 13
    expected = [len(b"".join(raw[:i]).decode("utf-8", errors="ignore")) for i in range(len(raw))]
    assert lp["text_offset"] == expected and expected[-1] <= len(whole["text"])
    assert all(len(top) >= 5 for top in lp["top_logprobs"][1:])  # five distinct keys at every position
    assert [o for c in chunks if c["logprobs"] for o in c["logprobs"]["text_offset"]] == expected
