"""Requests to the app through FastAPI's test client, for tests over a scripted engine: model "m", prompt /
user message "hi" unless ``fields`` say otherwise."""

from __future__ import annotations


def post_completion(client, **fields):
    return client.post("/v1/completions", json={"model": "m", "prompt": "hi", **fields})


def post_chat(client, **fields):
    return client.post(
        "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )
