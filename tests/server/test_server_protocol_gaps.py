"""Gaps found by a mutation sweep of ``nonstop/server`` (protocol field ranges, the submission's cancel on
disconnect and early exit, error bodies, ``bind_socket``): checked through the HTTP app (FastAPI's test client)
over the scripted engine of ``test_server_api_gaps`` or on the parts directly, with hand-written expectations."""

from __future__ import annotations

import asyncio
import socket
import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from nonstop.engine.loop import StreamEvent
from nonstop.server.app import ServingContext, create_app
from nonstop.server.errors import APIError, internal_error
from nonstop.server.launch import bind_socket
from nonstop.server.submission import Submission
from nonstop.server.translate import Limits
from tests.server.app_client import error_body, ok_body, post_chat, post_completion
from tests.server.test_server_api_gaps import ScriptedEngine, ScriptedLLM


def _client(engine=None) -> TestClient:
    ctx = ServingContext(
        llm=ScriptedLLM(),
        engine=engine or ScriptedEngine(),
        served_names=["m"],
        limits=Limits(max_len=64),
    )
    return TestClient(create_app(ctx, manage_engine=False))


_ok, _error = ok_body, error_body


# ------------------------------------------------------------------ request fields


def test_repetition_penalty_is_capped_at_100_by_the_server():
    """Catches a wider ``repetition_penalty`` bound in ``SamplingFields``: the engine accepts any positive
    float32, so the server's documented cap of 100 is the only guard against absurd values."""
    client = _client()
    assert _ok(post_completion(client, repetition_penalty=100.0, max_tokens=1))["choices"][0]["text"] == "o"
    error = _error(post_completion(client, repetition_penalty=100.5))
    assert error["param"] == "repetition_penalty"


def test_an_empty_logit_bias_is_neutral_and_a_real_one_is_refused():
    """Catches ``logit_bias`` refused when merely present: ``{}`` (what clients send when they serialise
    every field) changes nothing and must be accepted; a non-empty one cannot be honoured and is a 400."""
    client = _client()
    assert _ok(post_completion(client, logit_bias={}, max_tokens=1))["choices"][0]["text"] == "o"
    error = _error(post_completion(client, logit_bias={"5": 1.0}))
    assert (error["param"], error["code"]) == ("logit_bias", "unsupported_parameter")


def test_stream_options_need_stream_true():
    """Catches the ``stream`` condition dropped from the stream_options check: stream_options with
    stream=true is the normal streaming call and must work; without stream it is refused (as OpenAI does)."""
    client = _client()
    error = _error(post_completion(client, stream_options={"include_usage": True}))
    assert error["param"] == "stream_options"
    response = post_completion(client, stream=True, stream_options={"include_usage": True}, max_tokens=1)
    assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")


def test_a_stop_list_of_exactly_16_is_accepted_over_http():
    """Catches an off-by-one in the 16-stop-string limit (``> 15``): 16 strings are allowed."""
    stops = [f"zz{i}" for i in range(16)]
    assert _ok(post_completion(_client(), stop=stops, max_tokens=1))["choices"][0]["text"] == "o"
    assert _error(post_completion(_client(), stop=[*stops, "zz16"]))["param"] == "stop"


def test_an_empty_suffix_and_best_of_equal_to_n_are_neutral():
    """Catches ``suffix`` refused when merely present (``""`` asks for nothing) and ``best_of == n`` refused
    (it ranks nothing); a real suffix or a larger best_of is refused naming the field."""
    client = _client()
    assert len(_ok(post_completion(client, suffix="", best_of=1, max_tokens=1))["choices"]) == 1
    assert _error(post_completion(client, suffix="end"))["param"] == "suffix"
    assert _error(post_completion(client, best_of=3, n=1))["param"] == "best_of"


def test_a_content_part_without_a_type_says_what_is_missing():
    """Catches the ``"type" not in part`` check dropped: the client would get pydantic's union message
    instead of being told each part needs a type."""
    error = _error(post_chat(_client(), messages=[{"role": "user", "content": [{"text": "hi"}]}]))
    assert 'needs a "type"' in error["message"], error


@pytest.mark.parametrize("kind", ["image_url", "input_audio", "file"])
def test_a_non_text_content_part_is_refused_saying_the_model_reads_text_only(kind):
    """Catches the non-text check narrowed to one part type: an audio or file part would get pydantic's
    union message about strings instead of being told that only text parts are supported."""
    error = _error(post_chat(_client(), messages=[{"role": "user", "content": [{"type": kind}]}]))
    assert f"content parts of type {kind!r} are not supported" in error["message"], error


def test_tool_choice_auto_and_none_and_text_response_formats_are_accepted():
    """Catches the neutral values of tool_choice / response_format / modalities narrowed: ``auto`` and
    ``none`` (no tools to call), a response_format without a type or of type text, and text output only."""
    client = _client()
    for fields in (
        {"tool_choice": "auto"},
        {"tool_choice": "none"},
        {"function_call": "auto"},
        {"response_format": {"type": "text"}},
        {"response_format": {"strict": False}},
        {"modalities": ["text"]},
    ):
        assert _ok(post_chat(client, max_tokens=1, **fields))["choices"][0]["message"]["content"] == "o", fields


@pytest.mark.parametrize(
    "field, value",
    [
        ("verbosity", "low"),
        ("reasoning_effort", "low"),
        ("audio", {"voice": "x"}),
        ("prediction", {"type": "content"}),
        ("web_search_options", {}),
    ],
)
def test_unsupported_chat_fields_are_refused_naming_them(field, value):
    """Catches a field dropped from the list of those the server cannot honour: it would be silently
    ignored, and the client would believe e.g. a verbosity or a reasoning effort was applied."""
    error = _error(post_chat(_client(), **{field: value}))
    assert (error["param"], error["code"]) == (field, "unsupported_parameter")


def test_top_logprobs_with_logprobs_true_is_accepted():
    """Catches the ``logprobs`` condition dropped from the top_logprobs check: with logprobs=true,
    top_logprobs is how a client asks for alternatives and must not be refused."""
    body = _ok(post_chat(_client(), logprobs=True, top_logprobs=2, max_tokens=1))
    assert body["choices"][0]["message"]["content"] == "o" and body["choices"][0]["logprobs"] is not None


def test_null_fields_take_their_defaults():
    """Catches the null-is-left-out validator dropped: clients that serialise every field send ``null``
    for n / stream / temperature, which must mean the default, not a 400."""
    body = _ok(post_completion(_client(), n=None, stream=None, temperature=None, stop=None, max_tokens=1))
    assert [c["text"] for c in body["choices"]] == ["o"]


# ------------------------------------------------------------------ submission


class _HeldEngine:
    """Takes requests and holds them; ``finish(i)`` ends request i. Records cancels."""

    def __init__(self, max_waiting: int = 8):
        self.max_waiting, self.sinks, self.cancelled = max_waiting, [], []
        self.num_slots = 0

    def submit(self, request, sink) -> None:
        self.sinks.append((request, sink))

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


def _requests(count: int) -> list:
    out = []
    for i in range(count):
        req = SimpleNamespace(request_id=f"r{i}", prompt_ids=[1, 2, 3], output_ids=[7])
        req.output = lambda: SimpleNamespace(metrics=None)
        out.append(req)
    return out


def _metrics():
    return SimpleNamespace(record_finished=lambda *args: None)


def test_a_gone_client_cancels_the_unfinished_requests_within_a_second():
    """Catches a disconnect that does not end ``events`` (or is polled far too rarely): the engine would
    go on generating for a client that left. Only the request still running is cancelled."""
    engine = _HeldEngine()

    async def run():
        sub = Submission(engine, _metrics(), _requests(2))
        sub.start()
        first = engine.sinks[0][0]
        engine.sinks[0][1](StreamEvent(first, "x", [7], None, "stop"))
        seen = []

        async def gone():
            return True

        async def consume():
            async for index, event in sub.events(gone):
                seen.append((index, event.finish_reason))

        await asyncio.wait_for(consume(), 3.0)
        return seen

    start = time.monotonic()
    seen = asyncio.run(run())
    assert time.monotonic() - start < 2.0
    assert engine.cancelled == ["r1"]
    assert seen in ([], [(0, "stop")])


def test_leaving_the_iteration_early_cancels_only_the_unfinished_requests():
    """Catches the ``finally`` cancel dropped or inverted: a stream closed after its first event (a failed
    send, a cancelled task) must free the slots of the requests still running, and not cancel finished ones."""
    engine = _HeldEngine()

    async def run():
        sub = Submission(engine, _metrics(), _requests(3))
        sub.start()
        req, sink = engine.sinks[1]
        sink(StreamEvent(req, "x", [7], None, "length"))
        events = sub.events()
        index, event = await events.__anext__()
        await events.aclose()
        return index, event.finish_reason

    assert asyncio.run(run()) == (1, "length")
    assert sorted(engine.cancelled) == ["r0", "r2"]


def test_events_carry_the_index_of_their_choice_in_arrival_order():
    """Catches a wrong choice index on the queue: events of request i must come back tagged i, so that
    chunks and choices land under the right ``index``."""
    engine = _HeldEngine()

    async def run():
        sub = Submission(engine, _metrics(), _requests(3))
        sub.start()
        for i in (2, 0, 1):
            req, sink = engine.sinks[i]
            sink(StreamEvent(req, "t", [7], None, None))
            sink(StreamEvent(req, "", [], None, "stop"))
        return [(i, e.finish_reason) for i, e in [x async for x in sub.events()]]

    assert asyncio.run(run()) == [
        (2, None),
        (2, "stop"),
        (0, None),
        (0, "stop"),
        (1, None),
        (1, "stop"),
    ]
    assert engine.cancelled == []


def test_a_refusal_part_way_cancels_the_requests_already_submitted():
    """Catches the cancel dropped (or aimed at nothing) when the queue fills part way through a call's
    submissions: the requests that did get in would run for a client that was told 429."""
    from nonstop.engine.loop import EngineOverloaded

    class Engine(_HeldEngine):
        def submit(self, request, sink):
            if len(self.sinks) == 2:
                raise EngineOverloaded("the waiting queue is full")
            super().submit(request, sink)

    engine = Engine()

    async def run():
        Submission(engine, _metrics(), _requests(3)).start()

    with pytest.raises(APIError) as caught:
        asyncio.run(run())
    assert caught.value.status == 429
    assert engine.cancelled == ["r0", "r1"]


def test_only_a_finished_event_is_recorded_with_prompt_and_output_counts():
    """Catches metrics recorded for every event (tokens counted many times) or with the prompt and output
    counts swapped."""
    engine, recorded = _HeldEngine(), []
    metrics = SimpleNamespace(record_finished=lambda *args: recorded.append(args[:3]))

    async def run():
        sub = Submission(engine, metrics, _requests(1))
        sub.start()
        req, sink = engine.sinks[0]
        sink(StreamEvent(req, "a", [7], None, None))
        sink(StreamEvent(req, "", [], None, "length"))
        return [x async for x in sub.events()]

    assert len(asyncio.run(run())) == 2
    assert recorded == [("length", 3, 1)]


# ------------------------------------------------------------------ errors


def test_error_types_follow_the_status():
    """Catches a wrong entry in ERROR_TYPES, or an explicit ``type`` ignored: the openai client and
    dashboards key on the type."""
    assert APIError(429, "x").type == "rate_limit_error"
    assert APIError(503, "x").type == "service_unavailable"
    assert APIError(500, "x").type == "server_error"
    assert APIError(401, "x").type == APIError(404, "x").type == "invalid_request_error"
    assert APIError(400, "x", type="custom").type == "custom"


def test_an_error_body_is_ascii_json_with_its_headers():
    """Catches the ASCII escaping dropped (a non-ASCII message would go out raw) and the headers (e.g.
    Retry-After) lost on the response."""
    response = APIError(429, "caf\u00e9", headers={"Retry-After": "1"}).response()
    assert response.body == b'{"error":{"message":"caf\\u00e9","type":"rate_limit_error","param":null,"code":null}}'
    assert response.headers["retry-after"] == "1"


def test_a_wrong_method_names_it_and_lists_the_allowed_ones():
    """Catches the 405 branch dropped (a bare "Method Not Allowed") or the ``Allow`` header lost."""
    response = _client().get("/v1/completions")
    error = _error(response, 405)
    assert error["message"] == "method GET is not allowed on /v1/completions"
    assert response.headers["allow"] == "POST"


def test_an_internal_error_names_the_exception_type_but_not_its_text():
    """Catches the exception's text sent to the client: it may hold internal details (paths, tensors);
    the client gets only its type."""
    error = internal_error(RuntimeError("/secret/path exploded")).body()["error"]
    assert error["message"] == "internal error: RuntimeError" and error["code"] == "internal_error"


def test_a_validation_error_names_the_field_without_body():
    """Catches the ``body`` prefix kept in a framework validation error's location (``body.temperature``) or
    the param left empty; no route of ours raises one today, so the handler is checked directly."""
    from fastapi.exceptions import RequestValidationError

    from nonstop.server.errors import _validation_error

    error = _validation_error(RequestValidationError([{"loc": ("body", "temperature"), "msg": "bad", "type": "x"}]))
    assert (error.status, error.param, error.message) == (
        400,
        "temperature",
        "temperature: bad",
    )
    assert _validation_error(RequestValidationError([])).message == "body: invalid value"


# ------------------------------------------------------------------ bind_socket


@pytest.mark.parametrize("host", ["", "   "])
def test_an_empty_host_is_a_clear_error(host):
    """Catches the blank-host check narrowed to the empty string: a host of spaces would reach getaddrinfo
    and fail with a resolver message instead of saying the flag is empty."""
    with pytest.raises(ValueError, match="--host is empty"):
        bind_socket(host, 0)


def test_a_port_in_use_is_a_value_error_naming_the_address():
    """Catches the bind failure raised as a bare OSError: ``nonstop serve`` reports only ValueErrors as
    one clear line, so the user would get a traceback for a port that is taken."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with pytest.raises(ValueError, match=f"cannot listen on 127.0.0.1:{port}"):
            bind_socket("127.0.0.1", port)
    finally:
        taken.close()


# ------------------------------------------------------------------ build_context


def test_the_serving_core_isolates_errors_per_request_over_max_batch_slots():
    """Catches ``isolate_errors`` dropped from the server's core: one client's failing request would then end
    every request decoded beside it. Also checks the slots and the context reach the core."""
    from nonstop.server.launch import build_context

    made = {}

    def new_core(slots, isolate_errors, max_len):
        made.update(slots=slots, isolate_errors=isolate_errors, max_len=max_len)
        return SimpleNamespace()

    llm = SimpleNamespace(
        cfg=SimpleNamespace(max_position_embeddings=100),
        new_core=new_core,
        generation=SimpleNamespace(defaults={}),
    )
    build_context(llm, ["m"], max_batch=3, max_model_len=40)
    assert made == {"slots": 3, "isolate_errors": True, "max_len": 40}


@pytest.mark.parametrize("prompt", [[True, False], [[1, True]], [1.5, 2]])
def test_a_prompt_of_booleans_or_floats_is_refused_with_the_shapes_allowed(prompt):
    """Catches booleans taken for token ids by the prompt-shape check (JSON true is a Python int): the
    client would get pydantic's message about one union member instead of the list of prompt shapes."""
    error = _error(post_completion(_client(), prompt=prompt))
    assert error["param"] == "prompt"
    shapes = "give a string, a list of strings, a list of token ids or a list of token-id lists"
    assert error["message"] == f"prompt: {shapes}"


def test_a_stop_signal_ends_the_requests_still_running_after_the_grace_period(monkeypatch):
    """Catches the grace timer never started on a stop signal: requests still generating would keep uvicorn
    waiting until it cancels them (a bare 500 each) instead of ending them with a clear error."""
    import threading

    import nonstop.server.launch as launch

    pytest.importorskip("uvicorn")
    monkeypatch.setattr(launch, "GRACE_S", 0.01)
    stopped = threading.Event()
    server = launch._server(SimpleNamespace(), SimpleNamespace(stop=stopped.set), 0.0)
    server.handle_exit(2, None)
    assert stopped.wait(2.0)
    assert server.should_exit
