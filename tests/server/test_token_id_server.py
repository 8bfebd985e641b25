"""A server whose model decodes token ids only (``tokenizer="ids"``): a stop string could never match, so
the request is refused naming ``stop`` instead of running to ``max_tokens``; stop token ids still work."""

from __future__ import annotations

import httpx
import pytest

from nonstop.engine.llm import LLM
from nonstop.server import build_context
from tests.server.conftest import MODEL_NAME
from tests.server.inprocess import serve_in_thread


@pytest.fixture(scope="module")
def url(model_dir):
    llm = LLM(model_dir, dtype="float32", max_batch=2, tokenizer="ids")
    with serve_in_thread(build_context(llm, [MODEL_NAME], max_batch=2)) as base:
        yield base


def test_a_stop_string_is_refused_naming_stop(url):
    body = {"model": MODEL_NAME, "prompt": [3, 4, 5], "max_tokens": 4, "stop": ["x"]}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "stop" and "stop strings need a tokenizer" in error["message"], error


def test_stop_token_ids_run(url):
    body = {"model": MODEL_NAME, "prompt": [3, 4, 5], "max_tokens": 4, "stop_token_ids": [7]}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 4
