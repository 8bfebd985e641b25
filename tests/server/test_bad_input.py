"""Bad requests get a 4xx with an OpenAI error body, and the server keeps serving."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.server.conftest import MAX_MODEL_LEN, MODEL_NAME, start_server, stop_server

OK_COMPLETION = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}
OK_CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

BAD_COMPLETIONS = {
    "malformed json": (b'{"model": "tiny-k3", "prompt": ', 400),
    "not an object": (b"[1, 2, 3]", 400),
    "not utf-8": (b"\xff\xfe\x00", 400),
    "missing model": ({"prompt": "hi"}, 400),
    "missing prompt": ({"model": MODEL_NAME}, 400),
    "unknown model": ({**OK_COMPLETION, "model": "gpt-17"}, 404),
    "prompt wrong type": ({**OK_COMPLETION, "prompt": {"text": "hi"}}, 400),
    "prompt mixed list": ({**OK_COMPLETION, "prompt": ["hi", 3]}, 400),
    "empty prompt": ({**OK_COMPLETION, "prompt": ""}, 400),
    "empty prompt list": ({**OK_COMPLETION, "prompt": []}, 400),
    "empty token list": ({**OK_COMPLETION, "prompt": [[]]}, 400),
    "token outside vocab": ({**OK_COMPLETION, "prompt": [5, 99999]}, 400),
    "prompt longer than context": ({**OK_COMPLETION, "prompt": "x" * (MAX_MODEL_LEN + 10)}, 400),
    "prompt + max_tokens over context": ({**OK_COMPLETION, "prompt": "x" * 200, "max_tokens": 100}, 400),
    "max_tokens zero": ({**OK_COMPLETION, "max_tokens": 0}, 400),
    "max_tokens negative": ({**OK_COMPLETION, "max_tokens": -5}, 400),
    "max_tokens absurd": ({**OK_COMPLETION, "max_tokens": 10**12}, 400),
    "max_tokens string": ({**OK_COMPLETION, "max_tokens": "5"}, 400),
    "max_tokens float": ({**OK_COMPLETION, "max_tokens": 2.5}, 400),
    "temperature negative": ({**OK_COMPLETION, "temperature": -0.5}, 400),
    "temperature too high": ({**OK_COMPLETION, "temperature": 7}, 400),
    "temperature string": ({**OK_COMPLETION, "temperature": "hot"}, 400),
    "top_p zero": ({**OK_COMPLETION, "top_p": 0}, 400),
    "top_p above one": ({**OK_COMPLETION, "top_p": 1.5}, 400),
    "top_k below -1": ({**OK_COMPLETION, "top_k": -3}, 400),
    "n above the limit": ({**OK_COMPLETION, "n": 129}, 400),
    "prompts x n above the limit": ({**OK_COMPLETION, "prompt": ["a"] * 9, "n": 8}, 400),
    "logprobs too many": ({**OK_COMPLETION, "logprobs": 500}, 400),
    "stop wrong type": ({**OK_COMPLETION, "stop": [1, 2]}, 400),
    "empty stop string": ({**OK_COMPLETION, "stop": [""]}, 400),
    "seed string": ({**OK_COMPLETION, "seed": "abc"}, 400),
    "stream not bool": ({**OK_COMPLETION, "stream": "yes"}, 400),
    "presence penalty out of range": ({**OK_COMPLETION, "presence_penalty": 2.5}, 400),
    "unknown field": ({**OK_COMPLETION, "max_token": 5}, 400),
    "too many prompts": ({**OK_COMPLETION, "prompt": ["a"] * 100}, 400),
    "body too large": ({**OK_COMPLETION, "prompt": "x" * (2 << 20)}, 413),
}

BAD_CHATS = {
    "no messages": ({"model": MODEL_NAME, "messages": []}, 400),
    "messages not a list": ({"model": MODEL_NAME, "messages": "hi"}, 400),
    "unknown role": ({"model": MODEL_NAME, "messages": [{"role": "robot", "content": "hi"}]}, 400),
    "content wrong type": ({"model": MODEL_NAME, "messages": [{"role": "user", "content": 42}]}, 400),
    "image content": (
        {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        },
        400,
    ),
    "unknown model": ({**OK_CHAT, "model": "nope"}, 404),
    "max_completion_tokens zero": ({**OK_CHAT, "max_completion_tokens": 0}, 400),
    "conversation longer than context": ({**OK_CHAT, "messages": [{"role": "user", "content": "y" * 300}]}, 400),
    "top_logprobs without logprobs": ({**OK_CHAT, "top_logprobs": 2}, 400),
    "tools": ({**OK_CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400),
}


def _post(server, path: str, body) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.api + path, content=content, headers={"content-type": "application/json"}, timeout=30)


def _assert_openai_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]


@pytest.mark.parametrize("case", list(BAD_COMPLETIONS))
def test_bad_completion_requests(server, case):
    body, status = BAD_COMPLETIONS[case]
    _assert_openai_error(_post(server, "/completions", body), status)
    assert server.healthy()


@pytest.mark.parametrize("case", list(BAD_CHATS))
def test_bad_chat_requests(server, case):
    body, status = BAD_CHATS[case]
    _assert_openai_error(_post(server, "/chat/completions", body), status)
    assert server.healthy()


def test_unknown_route_and_wrong_method(server):
    _assert_openai_error(httpx.get(server.api + "/nothing-here"), 404)
    _assert_openai_error(httpx.get(server.api + "/completions"), 405)


def test_the_openai_client_raises_the_matching_errors(server):
    client = server.client()
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="missing", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=0)
    assert info.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "z" * 400}])
    assert info.value.body["code"] == "context_length_exceeded"
    assert client.completions.create(model=MODEL_NAME, prompt="fine", max_tokens=2).usage.completion_tokens >= 1
    assert server.wait_idle() == 0


def test_overload_gets_429_and_the_server_recovers(model_dir, tmp_path):
    """One slot and one waiting place: a burst of long requests overflows the queue."""
    small = start_server(model_dir, tmp_path, "--max-batch", "1", "--max-waiting", "1")
    try:
        body = {"model": MODEL_NAME, "prompt": "burst", "max_tokens": 30, "temperature": 0, "ignore_eos": True}
        with httpx.Client(timeout=60) as http:
            with ThreadPoolExecutor(6) as pool:
                responses = list(pool.map(lambda _: http.post(small.api + "/completions", json=body), range(6)))
        statuses = sorted(r.status_code for r in responses)
        assert 429 in statuses and 200 in statuses, statuses
        for r in responses:
            if r.status_code == 429:
                _assert_openai_error(r, 429)
                assert int(r.headers["retry-after"]) >= 1  # when to try again
        assert small.wait_idle() == 0 and small.healthy()
        ok = httpx.post(small.api + "/completions", json={**body, "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200
        # more completions in one call than its slot and the queue hold: a 400 (a 429 would never clear), not queued
        for many in ({**body, "n": 3}, {**body, "prompt": ["a", "b", "c"]}):
            r = httpx.post(small.api + "/completions", json=many, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_completions", r.text
        assert small.metric("nonstop_queue_depth") == 0
    finally:
        stop_server(small)
