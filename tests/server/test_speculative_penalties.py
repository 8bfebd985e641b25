"""A server under speculative decoding, which takes no penalties: a request that asks for one is refused as
``unsupported_parameter`` naming the penalty the client sent (before: ``param`` was ``prompt`` or
``messages``, with no code), and a request without one still runs."""

from __future__ import annotations

import httpx
import pytest

from nonstop.engine.llm import LLM
from nonstop.server import build_context
from tests.server.conftest import MODEL_NAME
from tests.server.inprocess import serve_in_thread

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": MODEL_NAME, "prompt": "abcabc", "max_tokens": 2}


@pytest.fixture(scope="module")
def url(model_dir):
    llm = LLM(model_dir, dtype="float32", max_batch=2, speculative={"method": "ngram", "num_tokens": 2})
    with serve_in_thread(build_context(llm, [MODEL_NAME], max_batch=2)) as base:
        yield base


@pytest.mark.parametrize(
    "route, body, named",
    [
        ("completions", {**COMPLETION, "repetition_penalty": 1.1}, "repetition_penalty"),
        ("completions", {**COMPLETION, "presence_penalty": 0.5}, "presence_penalty"),
        ("completions", {**COMPLETION, "frequency_penalty": -0.3}, "frequency_penalty"),
        ("completions", {**COMPLETION, "frequency_penalty": 0.2, "repetition_penalty": 0.9}, "repetition_penalty"),
        ("chat/completions", {**CHAT, "repetition_penalty": 1.1}, "repetition_penalty"),
        ("chat/completions", {**CHAT, "frequency_penalty": 1.0}, "frequency_penalty"),
    ],
)
def test_a_penalty_is_refused_naming_it(url, route, body, named):
    r = httpx.post(f"{url}/v1/{route}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (named, "unsupported_parameter"), error
    assert "speculative decoding" in error["message"]


@pytest.mark.parametrize("route, body", [("completions", COMPLETION), ("chat/completions", CHAT)])
def test_neutral_penalties_run(url, route, body):
    neutral = {**body, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    r = httpx.post(f"{url}/v1/{route}", json=neutral, timeout=60)
    assert r.status_code == 200, r.text
