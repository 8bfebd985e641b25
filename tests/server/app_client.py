"""Requests to the app through FastAPI's test client, for tests over a scripted engine: model "m", prompt /
user message "hi" unless ``fields`` say otherwise."""

from __future__ import annotations


def post_completion(client, **fields):
    return client.post("/v1/completions", json={"model": "m", "prompt": "hi", **fields})


def post_chat(client, **fields):
    return client.post(
        "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def ok_body(response) -> dict:
    """The JSON body of a 200 response (the response text shown when it is not one)."""
    assert response.status_code == 200, response.text
    return response.json()


def error_body(response, status: int = 400) -> dict:
    """The OpenAI-style ``error`` object of a ``status`` response."""
    assert response.status_code == status, response.text
    return response.json()["error"]
