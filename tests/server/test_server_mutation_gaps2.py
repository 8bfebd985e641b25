"""More gaps found by mutating ``nonstop/server``, checked through the HTTP app itself (FastAPI's test
client) over a scripted engine: each request "generates" the UTF-8 bytes of a fixed reply, one token per
byte, each with the logprob row {token: -1, token + 1: -2}, so every expected value below is hand
arithmetic over a byte-level tokenizer (token id = UTF-8 byte). No model is loaded."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from nonstop.engine.detokenize import IncrementalDecoder
from nonstop.engine.loop import EngineOverloaded, EngineStopped, StreamEvent
from nonstop.engine.requests import Request
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.server.app import ServingContext, create_app
from nonstop.server.errors import APIError
from nonstop.server.launch import build_context
from nonstop.server.metrics import ServerMetrics
from nonstop.server.protocol import CompletionBody
from nonstop.server.translate import MAX_DEPTH, Limits, parse_body
from tests.server.app_client import post_chat, post_completion

CONCAT = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _row(token: int) -> dict[int, float]:
    return {token: -1.0, token + 1: -2.0}


class ScriptedLLM:
    def __init__(self, template: str = CONCAT):
        self.tokenizer = ByteTokenizer(320)
        self.tokenizer.chat_template = template

    def sampling_defaults(self) -> dict:
        return {}

    def check_penalties(self, params) -> None:
        pass

    def make_requests(self, text, ids, params, request_id=None):
        one = dataclasses.replace(params, n=1)
        ids = ids if ids is not None else self.tokenizer.encode(text)
        if params.n == 1:
            return [Request(request_id, text, ids, one, frozenset())]
        return [Request(f"{request_id}-{i}", text, ids, one, frozenset()) for i in range(params.n)]


class ScriptedEngine:
    """Answers each submitted request at once with ``reply``'s bytes, one event per token (``max_tokens``
    cuts it); the last event ends it with ``length``."""

    def __init__(self, reply: str = "ok!", running: bool = True, active: int = 0, waiting: int = 0, refuse=None):
        self.reply, self.running, self.fatal_error, self.shutting_down = reply, running, None, False
        self.refuse = refuse  # an exception every submission raises
        self.num_active, self.num_waiting, self.max_waiting = active, waiting, 256
        self.num_slots = 0
        self.ids: list[str] = []

    def submit(self, req: Request, sink) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.ids.append(req.request_id)
        params, decoder = req.params, IncrementalDecoder(ByteTokenizer(320))
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None] + [_row(t) for t in req.prompt_ids[1:]]
        tokens = list(self.reply.encode())[: params.max_tokens]
        for i, t in enumerate(tokens):
            req.output_ids.append(t)
            rows = [_row(t)] if params.logprobs is not None else None
            sink(StreamEvent(req, decoder.push(t), [t], rows, "length" if i == len(tokens) - 1 else None))

    def cancel(self, request_id: str) -> None:
        pass


def _client(engine=None, template: str = CONCAT, **limits) -> TestClient:
    ctx = ServingContext(
        llm=ScriptedLLM(template),
        engine=engine or ScriptedEngine(),
        served_names=["m"],
        limits=Limits(max_len=limits.pop("max_len", 64), **limits),
    )
    return TestClient(create_app(ctx, manage_engine=False))


_complete, _chat = post_completion, post_chat


def _ok(response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def _error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def _events(response) -> list:
    assert response.status_code == 200, response.text
    out = []
    for block in response.text.split("\n\n"):
        if block:
            data = block.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# ------------------------------------------------------------------ body size limit, health, model routes


def _padded(size: int) -> bytes:
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}).encode()
    return body + b" " * (size - len(body))  # whitespace after the object is still valid JSON


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_of_exactly_the_limit_is_read_and_one_byte_more_is_a_413(chunked):
    client = _client(max_body_bytes=200)

    def post(raw: bytes):
        content = iter([raw[:100], raw[100:]]) if chunked else raw  # chunked: no Content-Length to go by
        return client.post("/v1/completions", content=content, headers={"content-type": "application/json"})

    assert _ok(post(_padded(200)))["choices"][0]["text"] == "o"
    error = _error(post(_padded(201)), 413)
    assert error["code"] == "request_too_large"


def test_a_body_may_nest_max_depth_levels_and_no_more():
    def nested(levels: int) -> bytes:  # the body object is level 1
        return json.dumps(
            {"model": "m", "prompt": "hi", "x": json.loads("[" * (levels - 1) + "]" * (levels - 1))}
        ).encode()

    def code(raw: bytes) -> str:
        with pytest.raises(APIError) as caught:
            parse_body(raw, CompletionBody, Limits(max_len=64))
        return caught.value.code

    assert code(nested(MAX_DEPTH)) == "unknown_parameter"  # deep enough to pass, then "x" is not a field
    assert code(nested(MAX_DEPTH + 1)) == "invalid_value"  # refused for its depth


def test_health_reports_the_engines_counts_and_a_stopped_engine_is_a_503_with_retry_after():
    assert _ok(_client(ScriptedEngine(active=2, waiting=5)).get("/health")) == {
        "status": "ok",
        "active_sequences": 2,
        "queue_depth": 5,
    }
    response = _client(ScriptedEngine(running=False)).get("/health")
    error = _error(response, 503)
    assert (error["type"], error["code"]) == ("service_unavailable", "engine_unavailable")
    assert response.headers["retry-after"] == "5"


def test_health_answers_head_and_the_openapi_document_has_unique_operation_ids():
    """GET and HEAD /health were one route: OpenAPI gave both operations one id (client generators refuse it)."""
    client = _client(ScriptedEngine(active=0, waiting=0))
    assert client.head("/health").status_code == 200
    paths = _ok(client.get("/openapi.json"))["paths"]
    ids = [op["operationId"] for item in paths.values() for op in item.values() if "operationId" in op]
    assert "get" in paths["/health"] and len(ids) == len(set(ids)), ids


def test_an_unknown_model_id_is_a_404_on_the_model_route():
    client = _client()
    assert _ok(client.get("/v1/models/m"))["id"] == "m"
    error = _error(client.get("/v1/models/other"), 404)
    assert (error["param"], error["code"]) == ("model", "model_not_found")


@pytest.mark.parametrize(
    "refusal, status, kind, code",
    [
        (EngineOverloaded("the waiting queue is full"), 429, "rate_limit_error", "queue_full"),
        (EngineStopped("the engine is not running"), 503, "service_unavailable", "engine_unavailable"),
    ],
)
def test_a_refused_submission_says_why_and_when_to_retry(refusal, status, kind, code):
    response = _complete(_client(ScriptedEngine(refuse=refusal)), max_tokens=1)
    error = _error(response, status)
    assert (error["type"], error["code"]) == (kind, code)
    assert response.headers["retry-after"] == "1"


def test_a_404_for_a_non_ascii_path_is_still_an_openai_error_body():
    response = _client().get("/v1/caf%C3%A9")
    error = _error(response, 404)
    assert error["message"] == "no route GET /v1/caf\u00e9"
    assert response.content.isascii()  # non-ASCII escaped in the JSON


# ------------------------------------------------------------------ completions: echo, logprobs, usage, ids


def test_echo_with_max_tokens_0_returns_the_prompt_alone_with_no_completion_tokens():
    body = _ok(_complete(_client(), echo=True, max_tokens=0, logprobs=0))
    (choice,) = body["choices"]
    assert choice["text"] == "hi"
    assert choice["logprobs"]["tokens"] == ["h", "i"]
    assert choice["logprobs"]["token_logprobs"] == [None, -1.0]  # the first token has no context
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 0, "total_tokens": 2}


def test_echo_with_logprobs_lists_the_prompts_logprobs_before_the_outputs():
    (choice,) = _ok(_complete(_client(), echo=True, max_tokens=2, logprobs=1))["choices"]
    assert choice["text"] == "hiok"
    lp = choice["logprobs"]
    assert lp["token_logprobs"] == [None, -1.0, -1.0, -1.0]
    assert lp["top_logprobs"] == [None, {"i": -1.0}, {"o": -1.0}, {"k": -1.0}]
    assert lp["text_offset"] == [0, 1, 2, 3]


def test_every_prompt_of_a_call_gets_its_own_completion():
    body = _ok(_complete(_client(), prompt=["a", "bc"], max_tokens=1))
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "o", "length"),
        (1, "o", "length"),
    ]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_stop_token_ids_must_lie_inside_the_vocabulary():
    client = _client()  # a vocabulary of 320 tokens: ids 0..319
    assert _ok(_complete(client, max_tokens=1, stop_token_ids=[319]))["choices"][0]["text"] == "o"
    error = _error(_complete(client, max_tokens=1, stop_token_ids=[320]), 400)
    assert (error["param"], error["code"]) == ("stop_token_ids", "invalid_value")


# ------------------------------------------------------------------ completion streams


def test_a_streamed_echo_leads_with_the_prompt_text():
    events = _events(_complete(_client(), echo=True, max_tokens=2, stream=True))
    assert events[-1] == "[DONE]"
    assert "".join(c["text"] for e in events[:-1] for c in e["choices"]) == "hiok"
    assert events[0]["choices"][0]["text"] == "hi"


def test_a_streamed_echo_with_logprobs_0_carries_the_prompts_tokens_and_offsets():
    events = _events(_complete(_client(), echo=True, max_tokens=2, logprobs=0, stream=True))
    choices = [c for e in events[:-1] for c in e["choices"]]
    assert "".join(c["text"] for c in choices) == "hiok"
    tokens = [t for c in choices for t in c["logprobs"]["tokens"]]
    offsets = [o for c in choices for o in c["logprobs"]["text_offset"]]
    assert tokens == ["h", "i", "o", "k"] and offsets == [0, 1, 2, 3]


def test_a_streamed_echo_without_logprobs_has_none_and_offsets_without_echo_start_at_0():
    events = _events(_complete(_client(), echo=True, max_tokens=2, stream=True))
    assert events[0]["choices"][0]["logprobs"] is None
    events = _events(_complete(_client(), prompt="hey", max_tokens=2, logprobs=0, stream=True))
    offsets = [o for e in events[:-1] for c in e["choices"] for o in c["logprobs"]["text_offset"]]
    assert offsets == [0, 1]


def test_a_token_inside_a_character_still_gets_its_chunk_and_logprobs():
    client = _client(ScriptedEngine(reply="é"))  # two byte tokens: the first completes no character
    events = _events(_complete(client, max_tokens=2, logprobs=0, stream=True))
    choices = [c for e in events[:-1] for c in e["choices"]]
    assert [t for c in choices for t in c["logprobs"]["token_logprobs"]] == [-1.0, -1.0]
    assert "".join(c["text"] for c in choices) == "é"


# ------------------------------------------------------------------ chat


def test_chat_logprobs_without_top_logprobs_list_each_token_with_no_alternatives():
    (choice,) = _ok(_chat(_client(), max_tokens=2, logprobs=True))["choices"]
    assert [(e["token"], e["logprob"], e["top_logprobs"]) for e in choice["logprobs"]["content"]] == [
        ("o", -1.0, []),
        ("k", -1.0, []),
    ]


def test_chat_text_is_returned_as_generated_and_a_chunk_without_text_keeps_its_content_key():
    client = _client(ScriptedEngine(reply=" é\n"))  # 4 byte tokens; the 2nd is half of the é
    (choice,) = _ok(_chat(client, max_tokens=4))["choices"]
    assert choice["message"]["content"] == " é\n"  # whitespace included, as generated
    chunks = _events(_chat(client, max_tokens=4, stream=True))[1:-1]  # after the role chunk, before [DONE]
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"content": " "},
        {"content": ""},  # a token inside a character: no text yet, but still a content delta
        {"content": "é"},
        {"content": "\n"},
    ]


def test_max_completion_tokens_wins_over_max_tokens():
    (choice,) = _ok(_chat(_client(), max_tokens=1, max_completion_tokens=2))["choices"]
    assert choice["message"]["content"] == "ok"


def test_chat_n_counts_against_the_completions_per_call_limit():
    client = _client()  # 64 completions per call
    assert len(_ok(_chat(client, max_tokens=1, n=64))["choices"]) == 64
    assert _error(_chat(client, max_tokens=1, n=65), 400)["param"] == "n"


def test_a_chat_stream_has_the_chunk_object_role_first_and_usage_last():
    events = _events(_chat(_client(), max_tokens=2, stream=True, stream_options={"include_usage": True}))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {e["object"] for e in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [e["usage"] for e in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}


def test_continuous_usage_ends_with_a_usage_chunk_too():
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = _events(_chat(_client(), max_tokens=2, stream=True, stream_options=options))[:-1]
    assert chunks[0]["usage"] is None  # the role chunk: nothing counted yet
    assert [e["usage"]["completion_tokens"] for e in chunks[1:3]] == [1, 2]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 4


def test_text_parts_join_without_a_separator_and_tool_call_id_reaches_the_template():
    client = _client(template="{% for m in messages %}{{ m.get('tool_call_id', '') }}{{ m['content'] }}{% endfor %}")
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    messages = [{"role": "user", "content": parts}, {"role": "tool", "content": "c", "tool_call_id": "id"}]
    body = _ok(client.post("/v1/chat/completions", json={"model": "m", "messages": messages, "max_tokens": 1}))
    assert body["usage"]["prompt_tokens"] == len("ab" + "idc")


# ------------------------------------------------------------------ fields refused or accepted


@pytest.mark.parametrize(
    "path, fields, param",
    [
        ("/v1/completions", {"temperature": 2.01}, "temperature"),  # OpenAI: 0..2
        ("/v1/completions", {"top_p": 0.0}, "top_p"),  # (0, 1]
        ("/v1/completions", {"min_p": 1.01}, "min_p"),
        ("/v1/completions", {"max_tokens": "5"}, "max_tokens"),  # strict types
        ("/v1/completions", {"n": 0}, "n"),
        (
            "/v1/completions",
            {"stream_options": {"include_usage": True, "bogus": 1}, "stream": True},
            "stream_options.bogus",
        ),
        ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # needs logprobs=true
        ("/v1/chat/completions", {"max_tokens": 0}, "max_tokens"),
    ],
)
def test_out_of_range_or_unsupported_fields_are_a_400_naming_them(path, fields, param):
    post = _complete if path == "/v1/completions" else _chat
    error = _error(post(_client(), **fields), 400)
    assert error["param"] == param


@pytest.mark.parametrize("fields", [{"best_of": 2, "n": 2}, {"top_k": -1}, {"temperature": 2.0}])
def test_fields_at_their_neutral_or_edge_value_are_accepted(fields):
    assert len(_ok(_complete(_client(), max_tokens=1, **fields))["choices"]) == fields.get("n", 1)


# ------------------------------------------------------------------ /metrics over HTTP


def _series(client) -> dict[str, float]:
    lines = client.get("/metrics").text.splitlines()
    return {k: float(v) for k, _, v in (x.rpartition(" ") for x in lines if not x.startswith("#"))}


def test_a_finished_request_counts_once_with_its_prompt_and_generated_tokens():
    client = _client()
    _ok(_complete(client, prompt="hey", max_tokens=2))  # 3 prompt tokens, 2 generated, one engine request
    series = _series(client)
    assert series['nonstop_request_finish_total{reason="length"}'] == 1
    assert series["nonstop_prompt_tokens_total"] == 3
    assert series["nonstop_generation_tokens_total"] == 2
    assert series['nonstop_requests_total{endpoint="/v1/completions",status="200"}'] == 1


def test_histograms_are_cumulative_and_count_single_token_requests():
    metrics = ServerMetrics(active=lambda: 0, waiting=lambda: 0)
    for ttft in (0.003, 0.02, 7.0):  # one generated token each: a TTFT, no time per output token
        metrics.record_finished("stop", 1, 1, {"time_to_first_token_s": ttft, "decode_time_s": 0.0})
    lines = metrics.render().splitlines()
    series = {k: float(v) for k, _, v in (x.rpartition(" ") for x in lines if not x.startswith("#"))}
    name = "nonstop_time_to_first_token_seconds"
    assert series[f'{name}_bucket{{le="0.005"}}'] == 1
    assert series[f'{name}_bucket{{le="0.025"}}'] == 2
    assert series[f'{name}_bucket{{le="10"}}'] == 3 and series[f'{name}_bucket{{le="+Inf"}}'] == 3
    assert series[f"{name}_count"] == 3
    assert series["nonstop_time_per_output_token_seconds_count"] == 0


def test_an_untouched_counter_is_exposed_at_zero():
    lines = ServerMetrics(active=lambda: 0, waiting=lambda: 0).render().splitlines()
    assert "nonstop_request_finish_total 0" in lines and "nonstop_requests_total 0" in lines


# ------------------------------------------------------------------ build_context: the serve flags reach the limits


def test_build_context_passes_the_flags_to_the_limits_and_the_queue():
    llm = SimpleNamespace(
        cfg=SimpleNamespace(max_position_embeddings=100),
        new_core=lambda slots, isolate_errors, max_len: SimpleNamespace(),
        generation=SimpleNamespace(defaults={"max_tokens": 7}),
    )
    ctx = build_context(llm, ["m"], max_waiting=3, max_model_len=500, max_prompts=2, default_max_tokens=5)
    assert ctx.limits.max_len == 100  # a --max-model-len past the model's positions is cut to them
    assert (ctx.limits.max_prompts, ctx.limits.default_max_tokens, ctx.engine.max_waiting) == (2, 5, 3)
    assert build_context(llm, ["m"]).limits.default_max_tokens == 7  # else the checkpoint's
