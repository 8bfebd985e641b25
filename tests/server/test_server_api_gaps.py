"""Gaps found by a third mutation sweep of ``nonstop/server``, checked through the HTTP app (FastAPI's test
client) over a scripted engine and a byte-level tokenizer (token id = UTF-8 byte), so every expected value is
hand arithmetic. Unlike the earlier scripted engines this one ends a request the way the real engine does:
``stop`` when its reply ends before ``max_tokens`` (an end-of-sequence), ``length`` when ``max_tokens`` cuts
it. Response bodies are also checked against the ``openai`` package's own types, an independent record of
the API's field names and literal values."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fastapi.testclient import TestClient
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from nonstop.engine.detokenize import IncrementalDecoder
from nonstop.engine.loop import StreamEvent
from nonstop.engine.requests import Request
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.server.app import ServingContext, create_app
from nonstop.server.translate import Limits
from tests.server.app_client import error_body, ok_body, post_chat, post_completion

CONCAT = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


class ScriptedLLM:
    def __init__(self):
        self.tokenizer = ByteTokenizer(320)
        self.tokenizer.chat_template = CONCAT
        self.params = []  # every SamplingParams a request was made with

    def sampling_defaults(self) -> dict:
        return {}

    def check_penalties(self, params) -> None:
        pass

    def make_requests(self, text, ids, params, request_id=None):
        self.params.append(params)
        one = dataclasses.replace(params, n=1)
        return [Request(f"{request_id}-{i}", text, ids, one, frozenset()) for i in range(params.n)]


class ScriptedEngine:
    """Answers each request at once with ``reply``'s bytes, one event per token: ``max_tokens`` cuts it
    (``length``), else the reply ends as an end-of-sequence would (``stop``, on an event with no text)."""

    def __init__(self, reply: str = "ok!"):
        self.reply, self.running, self.fatal_error, self.shutting_down = reply, True, None, False
        self.num_active = self.num_waiting = 0
        self.max_waiting = 256
        self.num_slots = 0

    def submit(self, req: Request, sink) -> None:
        decoder = IncrementalDecoder(ByteTokenizer(320))
        tokens = list(self.reply.encode())
        cut = len(tokens) > req.params.max_tokens
        tokens = tokens[: req.params.max_tokens]
        for i, t in enumerate(tokens):
            req.output_ids.append(t)
            last = i == len(tokens) - 1
            sink(StreamEvent(req, decoder.push(t), [t], None, "length" if last and cut else None))
        if not cut:
            req.output_ids.append(0)  # the end-of-sequence token: counted, never shown
            sink(StreamEvent(req, "", [0], None, "stop"))

    def cancel(self, request_id: str) -> None:
        pass


def _client(reply: str = "ok!", llm: ScriptedLLM | None = None, **limits) -> TestClient:
    ctx = ServingContext(
        llm=llm or ScriptedLLM(),
        engine=ScriptedEngine(reply),
        served_names=["m"],
        limits=Limits(max_len=limits.pop("max_len", 64), **limits),
    )
    return TestClient(create_app(ctx, manage_engine=False))


_complete, _chat = post_completion, post_chat


def _raw(client, path: str, raw: str):
    return client.post(path, content=raw.encode(), headers={"content-type": "application/json"})


_ok, _error = ok_body, error_body


def _events(response) -> list:
    assert response.status_code == 200, response.text
    assert response.text.endswith("data: [DONE]\n\n")
    out = []
    for block in response.text.split("\n\n"):
        if block:
            assert block.startswith("data: "), block
            data = block.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# ------------------------------------------------------------------ body parsing


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_constant_anywhere_in_the_body_is_invalid_json(constant):
    """Catches ``json.loads`` without ``parse_constant``: NaN / Infinity inside a free-form object that the
    schema lets through (``response_format``'s extra keys, a message's ``annotations``) would be accepted,
    although it is not JSON (RFC 8259) and the server promises strict JSON."""
    client = _client()
    message = '{"role": "user", "content": "hi", "annotations": [{"x": C}]}'
    bodies = [
        '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "text", "x": C}}',
        '{"model": "m", "messages": [' + message + "]}",
    ]
    for raw in bodies:
        error = _error(_raw(client, "/v1/chat/completions", raw.replace("C", constant)))
        assert error["code"] == "invalid_json" and "not valid JSON" in error["message"], error
    fine = (
        '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "text", "x": 1}}'
    )
    assert _ok(_raw(client, "/v1/chat/completions", fine))["choices"][0]["message"]["content"] == "ok!"


def test_a_key_with_a_lone_surrogate_is_refused_naming_where_it_is():
    """Catches a dropped key check in ``_check_tree``: a lone UTF-16 surrogate in a key of a free-form object
    (``metadata``) would be accepted, although only its values were checked and no valid Unicode holds one."""
    client = _client()
    raw = '{"model": "m", "prompt": "hi", "metadata": {"\\ud800": "x"}}'
    error = _error(_raw(client, "/v1/completions", raw))
    assert error["param"] == "metadata" and error["code"] == "invalid_value", error
    assert "lone UTF-16 surrogate" in error["message"]


@pytest.mark.parametrize("raw", ['"hi"', "5", "null", "[]", "true"])
def test_a_body_that_is_not_an_object_says_so(raw):
    """Catches the object check narrowed to lists: a string, number, null or bool body got pydantic's message
    instead of the one that says what the body must be."""
    error = _error(_raw(_client(), "/v1/completions", raw))
    assert error["message"] == "request body must be a JSON object", error


# ------------------------------------------------------------------ finish_reason, usage, response shapes


def test_finish_reason_is_stop_at_an_end_of_sequence_and_length_at_max_tokens_whole():
    """Catches ``finish_reason`` mapping ``length`` (or ``stop``) to the other: a whole response said the
    model stopped when max_tokens cut it, or the reverse. The end-of-sequence token counts in usage but never
    shows in the text. Both bodies must also parse as the openai package's types."""
    client = _client("ok!")
    for kw, reason, text, completion in (({"max_tokens": 2}, "length", "ok", 2), ({"max_tokens": 8}, "stop", "ok!", 4)):
        body = _ok(_complete(client, **kw))
        Completion.model_validate(body)
        (choice,) = body["choices"]
        assert (choice["text"], choice["finish_reason"]) == (text, reason)
        assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": completion, "total_tokens": 2 + completion}
        body = _ok(_chat(client, **kw))
        ChatCompletion.model_validate(body)
        (choice,) = body["choices"]
        assert choice["message"] == {"role": "assistant", "content": text}
        assert choice["finish_reason"] == reason and choice["index"] == 0
        assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")


@pytest.mark.parametrize("max_tokens, reason", [(2, "length"), (8, "stop")])
def test_a_chat_stream_ends_each_choice_with_its_finish_reason_then_usage_then_done(max_tokens, reason):
    """Catches a chat stream that mislabels the finish reason, repeats the content in the closing chunk,
    drops the usage chunk or the [DONE] line: every chunk is a ``chat.completion.chunk`` (openai's type),
    the contents join to the text, exactly one chunk per choice has a finish_reason, and with
    ``include_usage`` a last chunk with no choices carries the usage."""
    client = _client("ok!")
    events = _events(_chat(client, max_tokens=max_tokens, n=2, stream=True, stream_options={"include_usage": True}))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
        assert chunk["object"] == "chat.completion.chunk"
    *body, last = chunks
    completion = max_tokens if reason == "length" else 4
    assert last["choices"] == [] and last["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 2 * completion,
        "total_tokens": 2 + 2 * completion,
    }
    for index in (0, 1):
        mine = [c["choices"][0] for c in body if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["delta"].get("content", "") for c in mine) == "ok!"[:max_tokens]
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == [reason]
        assert all(c["usage"] is None for c in body)


@pytest.mark.parametrize("max_tokens, reason", [(2, "length"), (8, "stop")])
def test_a_completion_stream_ends_with_its_finish_reason(max_tokens, reason):
    """Catches a completion stream with a wrong ``object`` or finish reason, or without the final usage chunk
    or [DONE]: the texts join to the whole text, the last chunk of the choice holds the reason."""
    client = _client("ok!")
    events = _events(_complete(client, max_tokens=max_tokens, stream=True, stream_options={"include_usage": True}))
    *chunks, usage_chunk, done = events
    assert done == "[DONE]"
    assert all(c["object"] == "text_completion" for c in chunks + [usage_chunk])
    assert "".join(c["choices"][0]["text"] for c in chunks) == "ok!"[:max_tokens]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == reason
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    completion = max_tokens if reason == "length" else 4
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == completion
    Completion.model_validate({**usage_chunk, "choices": []})


# ------------------------------------------------------------------ OpenAI fields -> SamplingParams


def test_every_sampling_field_reaches_the_engines_params():
    """Catches a field dropped or rewritten on its way to ``SamplingParams`` (``n`` forced to 1, a default
    winning over the request, the stop list cut): each value sent is the value the engine gets."""
    llm = ScriptedLLM()
    fields = {
        "temperature": 0.5,
        "top_p": 0.25,
        "top_k": 7,
        "min_p": 0.125,
        "repetition_penalty": 1.5,
        "presence_penalty": -2.0,
        "frequency_penalty": 2.0,
        "seed": 11,
        "stop": ["a", "b"],
        "stop_token_ids": [3, 5],
        "ignore_eos": True,
        "n": 3,
        "max_tokens": 5,
    }
    body = _ok(_complete(_client(llm=llm), **fields))
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    (params,) = llm.params
    assert params.stop == ("a", "b") and params.stop_token_ids == (3, 5)
    for name in set(fields) - {"stop", "stop_token_ids"}:
        assert getattr(params, name) == fields[name], name
    assert params.logprobs is None and params.prompt_logprobs is None


def test_max_tokens_defaults_to_16_for_completions_and_the_rest_of_the_context_for_chat():
    """Catches a wrong default for a request without max_tokens: 16 for completions (OpenAI's), the room left
    in the context (max_len - prompt) for chat; a server default cut to that room."""
    llm = ScriptedLLM()
    client = _client(llm=llm, max_len=40)
    _ok(_complete(client))
    _ok(_chat(client))  # "hi": 2 tokens of a 40-token context
    assert [p.max_tokens for p in llm.params] == [16, 38]
    llm = ScriptedLLM()
    client = _client(llm=llm, max_len=40, default_max_tokens=39)
    _ok(_complete(client, prompt="abc"))
    _ok(_complete(client, max_tokens=30))  # an explicit value wins over the server's default
    assert [p.max_tokens for p in llm.params] == [37, 30]


def test_chat_logprobs_without_top_logprobs_ask_the_engine_for_zero_alternatives():
    """Catches ``top_logprobs`` passed through as None when only ``logprobs: true`` is sent: the engine would
    compute no logprobs at all. With ``top_logprobs`` k the engine is asked for k; without ``logprobs``, none."""
    llm = ScriptedLLM()
    client = _client(llm=llm)
    _ok(_chat(client, logprobs=True))
    _ok(_chat(client, logprobs=True, top_logprobs=3))
    _ok(_chat(client))
    assert [p.logprobs for p in llm.params] == [0, 3, None]


def test_completion_logprobs_ask_for_prompt_logprobs_only_with_echo():
    """Catches prompt logprobs computed (a second, costly pass) when ``echo`` is not set, or missing with it;
    an echo with max_tokens 0 runs one token, which the response leaves out."""
    llm = ScriptedLLM()
    client = _client(llm=llm)
    _ok(_complete(client, logprobs=2, max_tokens=3))
    body = _ok(_complete(client, logprobs=2, max_tokens=0, echo=True))
    assert [(p.logprobs, p.prompt_logprobs, p.max_tokens) for p in llm.params] == [(2, None, 3), (2, 2, 1)]
    assert body["choices"][0]["text"] == "hi" and body["usage"]["completion_tokens"] == 0


def test_a_validator_message_reaches_the_client_without_pydantics_prefix():
    """Catches the ``Value error, `` prefix left in: a validator's own message (the prompt's shapes, a
    content part's type) must read as the server wrote it, after the field it names."""
    client = _client()
    error = _error(_complete(client, prompt=[1.5]))
    assert error["message"] == (
        "prompt: give a string, a list of strings, a list of token ids or a list of token-id lists"
    )
    assert (error["param"], error["code"]) == ("prompt", "invalid_value")
    content = [{"type": "image_url", "image_url": {"url": "x"}}]
    error = _error(_chat(client, messages=[{"role": "user", "content": content}]))
    assert error["message"].startswith("messages[0].content: content parts of type 'image_url' are not supported")


# ------------------------------------------------------------------ errors and /metrics


def _series(client) -> dict[str, float]:
    lines = client.get("/metrics").text.splitlines()
    return {k: float(v) for k, _, v in (x.rpartition(" ") for x in lines if x and not x.startswith("#"))}


def test_metrics_count_calls_by_route_and_status_and_requests_by_finish_reason():
    """Catches the request counter not fed (or fed the wrong status) and the finish counter mislabelled: a
    200 and a 400 on /v1/completions, one request ending at an end-of-sequence (``stop``, 3 text tokens +
    the end-of-sequence) and one cut by max_tokens (``length``, 2 tokens), each prompt 2 tokens."""
    client = _client("ok!")
    _ok(_complete(client, max_tokens=8))
    _ok(_complete(client, max_tokens=2))
    _error(_complete(client, max_tokens=-1))
    series = _series(client)
    assert series['nonstop_requests_total{endpoint="/v1/completions",status="200"}'] == 2
    assert series['nonstop_requests_total{endpoint="/v1/completions",status="400"}'] == 1
    assert series['nonstop_request_finish_total{reason="stop"}'] == 1
    assert series['nonstop_request_finish_total{reason="length"}'] == 1
    assert series["nonstop_prompt_tokens_total"] == 4 and series["nonstop_generation_tokens_total"] == 6
    assert series["nonstop_time_to_first_token_seconds_count"] == 2
    assert series['nonstop_time_to_first_token_seconds_bucket{le="+Inf"}'] == 2


def test_unknown_routes_and_models_are_openai_404s():
    """Catches a 404 with a type OpenAI's API does not use, or without its message naming the route: a
    missing route or model is an ``invalid_request_error`` there, the code ``model_not_found`` for a
    model."""
    client = _client()
    error = _error(client.get("/v1/nope"), 404)
    assert error == {"message": "no route GET /v1/nope", "type": "invalid_request_error", "param": None, "code": None}
    error = _error(_complete(client, model="other"), 404)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "model", "model_not_found")


def test_a_chat_max_completion_tokens_of_0_is_refused_naming_that_field():
    """Catches the ``requested < 1`` check loosened: 0 then fell through to the engine's own check, whose
    error names ``max_tokens``, a field the client did not send."""
    error = _error(_chat(_client(), max_completion_tokens=0))
    assert (error["param"], error["code"]) == ("max_completion_tokens", "invalid_value"), error
    assert error["message"] == "max_completion_tokens must be at least 1, got 0"


@pytest.mark.parametrize("stop", ["", ["a", ""]])
def test_an_empty_stop_string_is_refused_naming_stop(stop):
    """Catches the engine's ``InvalidSamplingParam`` reported without its field: an empty stop string (which
    would match everywhere) passes the schema and is refused by ``SamplingParams``, naming ``stop``."""
    error = _error(_complete(_client(), stop=stop))
    assert (error["param"], error["code"]) == ("stop", "invalid_value"), error


def test_an_empty_prompt_is_refused_even_when_the_tokenizer_adds_a_bos_token():
    """Catches the ``text == ""`` check dropped: a tokenizer that prepends a BOS token encodes "" to one
    token, so only the text itself shows the prompt is empty."""
    llm = ScriptedLLM()
    llm.tokenizer.encode = lambda text: [1, *text.encode()]
    client = _client(llm=llm)
    for prompt in ("", ["hi", ""]):
        error = _error(_complete(client, prompt=prompt))
        assert (error["param"], error["code"]) == ("prompt", "empty_prompt"), error
    assert _ok(_complete(client, prompt="hi"))["usage"]["prompt_tokens"] == 3  # BOS + 2 bytes


def test_a_request_that_ends_before_its_first_token_has_no_time_to_first_token():
    """Catches TTFT / latency observed for a request that generated nothing (cancelled while queued): its
    "first token" time would be its abort time, skewing the histograms."""
    from nonstop.server.metrics import ServerMetrics

    metrics = ServerMetrics(active=lambda: 0, waiting=lambda: 0)
    metrics.record_finished("abort", 5, 0, {"time_to_first_token_s": 3.0, "decode_time_s": 0.0})
    text = metrics.render()
    assert "nonstop_time_to_first_token_seconds_count 0" in text
    assert "nonstop_request_latency_seconds_count 0" in text
    assert 'nonstop_request_finish_total{reason="abort"} 1' in text and "nonstop_prompt_tokens_total 5" in text


@pytest.mark.parametrize(
    ("messages", "param", "message"),
    [
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text", "Field required"),
        ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "messages[0].content[0].text", "valid string"),
        ([{"role": "user", "content": 5}], "messages[0].content", "valid string"),  # no member closer: the first
    ],
)
def test_a_union_field_reports_the_error_inside_the_member_meant(messages, param, message):
    """A content part without "text" was reported as "messages[0].content: Input should be a valid string" (the
    ``str`` member of ``str | list[TextPart]``); the deepest error names the part's missing field."""
    error = _chat(_client(), messages=messages).json()["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}: ") and message in error["message"]


def test_a_stop_list_with_a_number_names_the_item():
    error = _complete(_client(), stop=["a", 5]).json()["error"]
    assert error["param"] == "stop[1]" and "valid string" in error["message"]


def test_the_tree_check_and_validation_spell_a_path_alike():
    """The surrogate check named ``messages[0].content`` and pydantic's errors ``messages.0.content``: the
    same field was spelled two ways depending on which check refused it. Both now write list indices in
    brackets, as OpenAI does."""
    client = _client()
    surrogate = _raw(
        client, "/v1/chat/completions", '{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}'
    )
    invalid = _chat(client, messages=[{"role": "user", "content": 5}])
    assert _error(surrogate)["param"] == _error(invalid)["param"] == "messages[0].content"
    nested = _chat(client, messages=[{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text"}]}])
    assert _error(nested)["param"] == "messages[1].content[0].text"
