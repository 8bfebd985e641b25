"""Gaps in the app's HTTP surface over a scripted engine: the model cards, the lifespan, a request the engine
aborts (whole and streamed), an unhandled error, the stream's headers and the OpenAPI request schemas."""

from __future__ import annotations

import gc
import json

from fastapi.testclient import TestClient
from openai.types import Model

from nonstop.engine.detokenize import IncrementalDecoder
from nonstop.engine.loop import StreamEvent
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.server.app import ServingContext, create_app
from nonstop.server.translate import Limits
from tests.server.app_client import error_body, ok_body, post_chat, post_completion
from tests.server.test_server_mutation_gaps2 import ScriptedEngine, ScriptedLLM


class AbortingEngine(ScriptedEngine):
    """Sends one token, then ends the request with ``abort`` and an error, as the engine's stop does."""

    def submit(self, req, sink) -> None:
        decoder = IncrementalDecoder(ByteTokenizer(320))
        req.output_ids.append(ord("a"))
        sink(StreamEvent(req, decoder.push(ord("a")), [ord("a")], None))
        sink(StreamEvent(req, "", [], None, "abort", "boom"))


class LifespanEngine(ScriptedEngine):
    def __init__(self):
        super().__init__(running=False)
        self.calls = []

    def start(self):
        self.calls.append("start")
        self.running = True

    def stop(self):
        self.calls.append("stop")


def _client(engine=None, names=("m",), llm=None, **kw) -> TestClient:
    ctx = ServingContext(
        llm=llm or ScriptedLLM(), engine=engine or ScriptedEngine(), served_names=list(names), limits=Limits(64)
    )
    return TestClient(create_app(ctx, manage_engine=False), **kw)


def _events(response) -> list:
    assert response.status_code == 200, response.text
    blocks = [b.removeprefix("data: ") for b in response.text.split("\n\n") if b]
    return [b if b == "[DONE]" else json.loads(b) for b in blocks]


def test_models_lists_every_served_name_as_an_openai_model_card():
    """Catches served names after the first left out of /v1/models, or a card that is not OpenAI's Model
    (``created`` an integer of seconds, ``owned_by``, ``object: model``)."""
    client = _client(names=("a", "b/c"))
    data = ok_body(client.get("/v1/models"))
    assert data["object"] == "list" and [m["id"] for m in data["data"]] == ["a", "b/c"]
    for card in data["data"]:
        assert type(card["created"]) is int and card["owned_by"] == "nonstop" and card["max_model_len"] == 64
        Model.model_validate(card)
    assert ok_body(client.get("/v1/models/b/c"))["id"] == "b/c"  # a name with a slash has its own card


def test_chat_with_an_unknown_model_is_a_404_naming_the_model():
    """Catches the chat route not checking ``model``: any name would be answered as if it were served."""
    err = error_body(post_chat(_client(), model="gpt-4"), 404)
    assert (err["param"], err["code"]) == ("model", "model_not_found")


def test_health_says_why_the_engine_stopped():
    """Catches /health dropping the engine's fatal error: an operator would see only 'engine not running'."""
    engine = ScriptedEngine(running=False)
    engine.fatal_error = "CUDA error: out of memory"
    r = _client(engine).get("/health")
    assert r.status_code == 503 and r.json()["error"]["message"] == "CUDA error: out of memory"


def test_the_app_starts_and_stops_the_engine_and_freezes_the_startup_heap_while_serving():
    """Catches the lifespan not starting the engine (every request 503), not stopping it (the engine thread
    outlives the app), or the startup heap left in (or never released from) the collector's frozen set."""
    engine = LifespanEngine()
    ctx = ServingContext(llm=ScriptedLLM(), engine=engine, served_names=["m"], limits=Limits(64))
    gc.unfreeze()
    with TestClient(create_app(ctx)) as client:
        assert engine.calls == ["start"] and client.get("/health").status_code == 200
        assert gc.get_freeze_count() > 0
    assert engine.calls == ["start", "stop"] and gc.get_freeze_count() == 0


def test_an_aborted_request_is_a_500_or_a_503_while_shutting_down():
    """Catches ``abort`` not taken as a failure (a partial text returned as a success) or the shutdown and
    the generation failure given each other's status: 503 (retry elsewhere) only while shutting down."""
    engine = AbortingEngine()
    err = error_body(post_completion(_client(engine)), 500)
    assert err["code"] == "generation_failed" and "boom" in err["message"]
    engine.shutting_down = True
    err = error_body(post_completion(_client(engine)), 503)
    assert err["code"] == "server_shutting_down" and "boom" in err["message"]


def test_an_aborted_stream_ends_with_an_error_event_then_done_and_no_usage():
    """Catches an aborted stream read on past its error (a usage chunk as if it had finished) or never
    told of the failure; the stream is sent uncached as server-sent events."""
    r = post_chat(_client(AbortingEngine()), stream=True, stream_options={"include_usage": True})
    assert r.headers["cache-control"] == "no-cache" and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "generation_failed"
    assert all("error" not in e and e["choices"] for e in events[:-2])  # no usage-only chunk anywhere


class FailingLLM(ScriptedLLM):
    def make_requests(self, *a, **k):
        raise RuntimeError("bug")


def test_an_unhandled_error_is_a_counted_500_with_an_openai_body():
    """Catches an unexpected exception escaping as a bare 500 (no OpenAI body) or one the metrics never
    count."""
    client = _client(llm=FailingLLM(), raise_server_exceptions=False)
    err = error_body(post_completion(client), 500)
    assert err == {"message": "internal error: RuntimeError", "type": "server_error", "param": None,
                   "code": "internal_error"}  # fmt: skip
    assert 'nonstop_requests_total{endpoint="/v1/completions",status="500"} 1' in client.get("/metrics").text


def test_openapi_points_both_post_routes_at_their_request_schemas():
    """Catches the request bodies missing from /openapi.json (clients and fuzzers generate requests from
    them): each POST route's body is a $ref to a component schema with the route's own fields."""
    doc = ok_body(_client().get("/openapi.json"))
    for path, name, field in (
        ("/v1/completions", "CompletionBody", "prompt"),
        ("/v1/chat/completions", "ChatCompletionBody", "messages"),
    ):
        schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{name}"}
        assert field in doc["components"]["schemas"][name]["properties"]


def test_more_completions_than_the_queue_holds_is_a_400_naming_n():
    """Catches the too-many-completions refusal not naming ``n`` (the field a client must lower) or its code:
    a 429 could never clear, so the client must be told which field to change."""
    engine = ScriptedEngine()
    engine.max_waiting = 2
    err = error_body(post_completion(_client(engine), n=3), 400)
    assert (err["param"], err["code"], err["type"]) == ("n", "too_many_completions", "invalid_request_error")
    assert "at most 2" in err["message"]
