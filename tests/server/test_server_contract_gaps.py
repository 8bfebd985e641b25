"""Second-pass mutation gaps in ``nonstop/server``, checked through the HTTP app (FastAPI's test client)
over the scripted engine of ``test_server_mutation_gaps2``: each request "generates" the UTF-8 bytes of a
fixed reply, one token per byte (token id = byte), so expected values are hand arithmetic."""

from __future__ import annotations

import json

import pytest

from nonstop.engine.detokenize import IncrementalDecoder
from nonstop.engine.loop import StreamEvent
from nonstop.engine.sampling import MAX_N, SEED_RANGE
from nonstop.engine.tokenizer import ByteTokenizer
from tests.server.app_client import ok_body, post_chat, post_completion
from tests.server.test_server_mutation_gaps2 import ScriptedEngine, _client

# OpenAI's documented ranges (and vLLM's for its extensions), as /openapi.json must publish them: the
# request schema is what clients and fuzzers generate requests from, so a bound looser than the engine's
# sends them requests that fail with another message, a tighter one hides values the server accepts.
CHAT_BOUNDS = {
    "temperature": {"minimum": 0.0, "maximum": 2.0},
    "top_p": {"exclusiveMinimum": 0.0, "maximum": 1.0},
    "top_k": {"minimum": -1},
    "min_p": {"minimum": 0.0, "maximum": 1.0},
    "repetition_penalty": {"exclusiveMinimum": 0.0, "maximum": 100.0},
    "presence_penalty": {"minimum": -2.0, "maximum": 2.0},
    "frequency_penalty": {"minimum": -2.0, "maximum": 2.0},
    "n": {"minimum": 1, "maximum": MAX_N},
    "seed": {"minimum": SEED_RANGE[0], "maximum": SEED_RANGE[1]},
    "top_logprobs": {"minimum": 0, "maximum": 20},
    "stop_token_ids": {"maxItems": 64},
}


def _bounds(prop: dict) -> dict:
    """The range keywords of one property's schema (inside its non-null ``anyOf`` member, if any)."""
    members = [m for m in prop.get("anyOf", [prop]) if m.get("type") != "null"]
    assert len(members) == 1, prop
    keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "maxItems")
    return {k: v for k, v in members[0].items() if k in keys}


@pytest.mark.parametrize("field", sorted(CHAT_BOUNDS))
def test_openapi_publishes_each_sampling_fields_range(field):
    """Catches a field's range loosened or tightened in ``protocol`` (temperature below 0, top_p 0, top_k
    -2, min_p above 1, n 0 or MAX_N + 1, a seed outside torch's range, ...): the engine re-checks most of
    them, so only the published schema (and the message) shows the drift."""
    doc = ok_body(_client().get("/openapi.json"))
    props = doc["components"]["schemas"]["ChatCompletionBody"]["properties"]
    assert _bounds(props[field]) == CHAT_BOUNDS[field]


def test_openapi_publishes_the_completion_logprobs_range():
    """Catches /v1/completions' ``logprobs`` accepting a negative count or more than OpenAI's 20."""
    doc = ok_body(_client().get("/openapi.json"))
    prop = doc["components"]["schemas"]["CompletionBody"]["properties"]["logprobs"]
    assert _bounds(prop) == {"minimum": 0, "maximum": 20}


def test_echo_without_max_tokens_generates_as_well():
    """Catches ``echo`` with ``max_tokens`` left out taken for an echo-only (scoring) call: OpenAI's
    default of 16 tokens still applies, so the prompt comes back followed by the reply (3 tokens here)."""
    body = ok_body(post_completion(_client(), echo=True))
    assert body["choices"][0]["text"] == "hi" + "ok!"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}


def test_completion_logprobs_without_echo_cover_only_the_generated_tokens():
    """Catches the prompt's tokens put ahead of the generated ones in a whole completion's ``logprobs`` when
    ``echo`` is off (their text is not in ``text``, so tokens and text would disagree). The scripted rows
    are {t: -1, t + 1: -2}: with logprobs=1 each position shows only its own token."""
    choice = ok_body(post_completion(_client(), logprobs=1, max_tokens=2))["choices"][0]
    assert choice["text"] == "ok"
    assert choice["logprobs"] == {
        "tokens": ["o", "k"],
        "token_logprobs": [-1.0, -1.0],
        "top_logprobs": [{"o": -1.0}, {"k": -1.0}],
        "text_offset": [0, 1],
    }


def test_chat_logprobs_bytes_are_each_tokens_own_utf8_bytes():
    """Catches ``bytes`` taken from the token's display text instead of its raw bytes: a token that is half
    of "é" (C3 A9) shows as ``bytes:\\xc3`` but its bytes are [0xC3] alone."""
    client = _client(ScriptedEngine(reply="é"))
    content = ok_body(post_chat(client, logprobs=True, top_logprobs=1))["choices"][0]["logprobs"]["content"]
    assert [entry["bytes"] for entry in content] == [[0xC3], [0xA9]]
    assert [entry["top_logprobs"][0]["bytes"] for entry in content] == [[0xC3], [0xA9]]


def _sse(response) -> list:
    assert response.status_code == 200, response.text
    blocks = [b.removeprefix("data: ") for b in response.text.split("\n\n") if b]
    return [b if b == "[DONE]" else json.loads(b) for b in blocks]


@pytest.mark.parametrize("post", [post_chat, post_completion])
def test_stream_without_stream_options_has_no_usage_key(post):
    """Catches every chunk given ``"usage": null`` when the client did not ask for usage (the key belongs to
    ``stream_options.include_usage`` streams only, as OpenAI sends them)."""
    chunks = _sse(post(_client(), stream=True, max_tokens=2))
    assert chunks[-1] == "[DONE]"
    assert all("usage" not in chunk for chunk in chunks[:-1])


class LateFinishEngine(ScriptedEngine):
    """Sends the reply's tokens, then ends the request with an event that carries no token (as the engine
    does when a stop string completes inside held-back text or a request is stopped between steps)."""

    def submit(self, req, sink) -> None:
        decoder = IncrementalDecoder(ByteTokenizer(320))
        for t in self.reply.encode():
            req.output_ids.append(t)
            sink(StreamEvent(req, decoder.push(t), [t], [{t: -1.0, t + 1: -2.0}]))
        sink(StreamEvent(req, "", [], None, "stop"))


def test_a_finish_chunk_without_tokens_has_null_logprobs():
    """Catches logprobs built for an event with no tokens: the chat stream's closing chunk (empty delta,
    finish_reason) must carry ``"logprobs": null``, not an empty ``content`` list."""
    chunks = _sse(post_chat(_client(LateFinishEngine(reply="ab")), stream=True, logprobs=True))
    last = chunks[-2]["choices"][0]
    assert last == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert [c["choices"][0]["logprobs"]["content"][0]["token"] for c in chunks[1:-2]] == ["a", "b"]


def test_metrics_count_a_lookalike_of_the_models_route_as_other():
    """Catches the ``/v1/models/{model}`` label given to any path that merely starts with ``/v1/models``
    (``/v1/modelsx`` is no route: a 404 counted under ``other``, while a real card lookup keeps its label)."""
    client = _client()
    assert client.get("/v1/modelsx").status_code == 404
    assert client.get("/v1/models/m").status_code == 200
    text = client.get("/metrics").text
    assert 'nonstop_requests_total{endpoint="other",status="404"} 1' in text
    assert 'nonstop_requests_total{endpoint="/v1/models/{model}",status="200"} 1' in text
    assert 'endpoint="/v1/models/{model}",status="404"' not in text
