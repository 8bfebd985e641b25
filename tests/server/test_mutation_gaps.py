"""Gaps found by mutating ``nonstop/server``: context arithmetic, the choice limits, logprobs listings,
text offsets, usage with n > 1, stream chunk shapes, the queue limits, the API key's scheme, route
labels and the Prometheus series. Pure functions over a
byte-level tokenizer (token id = UTF-8 byte), values from the OpenAI / Prometheus definitions and hand
arithmetic; no model is loaded."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from nonstop.engine.loop import EngineOverloaded, StreamEvent
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.server.app import _api_key_check, _choices, _usage_mode, route_label
from nonstop.server.errors import APIError
from nonstop.server.metrics import ServerMetrics
from nonstop.server.protocol import ChatCompletionBody, ChatMessage, CompletionBody, StreamOptions
from nonstop.server.responses import Choice, ResponseBuilder, TextOffsets, usage
from nonstop.server.submission import Submission
from nonstop.server.translate import Limits, _check_choices, chat_requests, parse_body, resolve_max_tokens

TOK = ByteTokenizer(320)


def _refused(fn, *args) -> APIError:
    with pytest.raises(APIError) as caught:
        fn(*args)
    return caught.value


# ------------------------------------------------------------------ max_tokens against the context


def test_prompt_plus_max_tokens_may_fill_the_context_but_not_pass_it():
    limits = Limits(max_len=10)
    assert resolve_max_tokens(6, 4, limits, 16, "max_tokens", "prompt") == 6  # 4 + 6 = 10: exactly the context
    error = _refused(resolve_max_tokens, 7, 4, limits, 16, "max_tokens", "prompt")  # 4 + 7 = 11
    assert (error.status, error.param, error.code) == (400, "max_tokens", "context_length_exceeded")


def test_a_prompt_that_fills_the_context_leaves_no_room_to_generate():
    error = _refused(resolve_max_tokens, None, 10, Limits(max_len=10), 16, "max_tokens", "prompt")
    assert (error.status, error.param, error.code) == (400, "prompt", "context_length_exceeded")


def test_a_default_max_tokens_is_cut_to_the_room_left():
    limits = Limits(max_len=10)
    assert resolve_max_tokens(None, 9, limits, 16, "max_tokens", "prompt") == 1  # completions' 16, 1 token of room
    assert resolve_max_tokens(None, 4, limits, None, "max_tokens", "messages") == 6  # chat: the rest of the context


def test_the_servers_default_max_tokens_wins_over_the_endpoints():
    limits = Limits(max_len=100, default_max_tokens=5)  # --default-max-tokens 5
    assert resolve_max_tokens(None, 4, limits, 16, "max_tokens", "prompt") == 5
    assert resolve_max_tokens(None, 4, limits, None, "max_tokens", "messages") == 5


# ------------------------------------------------------------------ prompts x n


def test_prompts_and_prompts_times_n_limits_are_inclusive():
    limits = Limits(max_len=100)  # 16 prompts, 64 completions per call
    _check_choices(16, 4, limits)  # 16 x 4 = 64: allowed
    _check_choices(1, 64, limits)
    assert _refused(_check_choices, 17, 1, limits).param == "prompt"
    assert _refused(_check_choices, 2, 33, limits).param == "n"  # 66 completions, though n alone is under 64
    assert _refused(_check_choices, 1, 65, limits).param == "n"


# ------------------------------------------------------------------ logprobs listings


ROW = {ord("A"): -0.5, ord("B"): -1.0, ord("C"): -2.0, ord("D"): -3.0}


def test_completion_top_logprobs_are_the_best_k_plus_the_sampled_token():
    builder = ResponseBuilder("completion", "m", TOK, 2, "cmpl-x")
    out = builder.logprobs([ord("D"), ord("A")], [ROW, ROW])
    assert out["tokens"] == ["D", "A"]
    assert out["token_logprobs"] == [-3.0, -0.5]
    assert out["top_logprobs"] == [{"A": -0.5, "B": -1.0, "D": -3.0}, {"A": -0.5, "B": -1.0}]
    assert out["text_offset"] == [0, 1]


def test_chat_top_logprobs_are_the_best_k_in_order_with_their_bytes():
    builder = ResponseBuilder("chat", "m", TOK, 2, "chatcmpl-x")
    (entry,) = builder.logprobs([ord("D")], [ROW])["content"]
    assert (entry["token"], entry["logprob"], entry["bytes"]) == ("D", -3.0, [68])
    assert entry["top_logprobs"] == [
        {"token": "A", "logprob": -0.5, "bytes": [65]},
        {"token": "B", "logprob": -1.0, "bytes": [66]},
    ]


def test_text_offsets_point_at_where_each_token_starts():
    ids = list("hé!".encode())  # h, the two bytes of é, !
    assert TextOffsets(TOK).take(ids) == [0, 1, 1, 2]  # é's second byte completes the character at 1
    assert TextOffsets(TOK, start=5).take(ids) == [5, 6, 6, 7]  # after a 5-character echoed prompt


# ------------------------------------------------------------------ usage and choices with n > 1


def test_usage_counts_each_prompt_once_however_many_completions():
    choices = _choices(4, 2)  # 2 prompts x n=2
    assert [c.counts_prompt for c in choices] == [True, False, True, False]
    for c, (prompt, generated) in zip(choices, [(5, 3), (5, 2), (7, 1), (7, 4)]):
        c.prompt_tokens, c.token_ids = prompt, list(range(generated))
    assert usage(choices) == {"prompt_tokens": 12, "completion_tokens": 10, "total_tokens": 22}


def test_continuous_usage_stats_is_the_every_chunk_mode():
    on = SimpleNamespace(stream_options=StreamOptions(include_usage=True, continuous_usage_stats=True))
    last = SimpleNamespace(stream_options=StreamOptions(include_usage=True))
    off = SimpleNamespace(stream_options=StreamOptions(continuous_usage_stats=True))
    assert (_usage_mode(on), _usage_mode(last), _usage_mode(off)) == ("every", "last", None)


# ------------------------------------------------------------------ stream chunks


def _event(text="", token_ids=(), reason=None) -> StreamEvent:
    request = SimpleNamespace(prompt_ids=[1, 2], prompt_logprobs=None)
    return StreamEvent(request, text, list(token_ids), None, reason)


def test_an_event_with_nothing_to_say_sends_no_chunk():
    for kind in ("chat", "completion"):
        assert ResponseBuilder(kind, "m", TOK, None, "x").delta_chunk(0, _event()) is None


def test_chat_chunks_open_with_the_role_and_close_with_an_empty_delta():
    builder = ResponseBuilder("chat", "m", TOK, None, "chatcmpl-x")
    (opening,) = builder.role_chunk(0)["choices"]
    assert opening["delta"] == {"role": "assistant", "content": ""}
    (closing,) = builder.delta_chunk(0, _event(reason="stop"))["choices"]
    assert closing["delta"] == {} and closing["finish_reason"] == "stop"
    (middle,) = builder.delta_chunk(0, _event("hi", [104, 105]))["choices"]
    assert middle["delta"] == {"content": "hi"} and middle["finish_reason"] is None


def test_a_whole_echoed_completion_lists_prompt_then_output_with_offsets_across_both():
    builder = ResponseBuilder("completion", "m", TOK, 0, "cmpl-x")
    prompt = list(b"Hi ")
    request = SimpleNamespace(prompt_ids=prompt, prompt_logprobs=[None, {ord("i"): -1.0}, {ord(" "): -2.0}])
    choice = Choice(0)
    choice.add(StreamEvent(request, "ok", [111, 107], [{111: -0.25}, {107: -0.5}], "length"))
    (item,) = builder.body([choice], ["Hi "])["choices"]
    assert item["text"] == "Hi ok" and item["finish_reason"] == "length"
    lp = item["logprobs"]
    assert lp["tokens"] == ["H", "i", " ", "o", "k"]
    assert lp["token_logprobs"] == [None, -1.0, -2.0, -0.25, -0.5]
    assert lp["text_offset"] == [0, 1, 2, 3, 4]  # the output starts after the 3 echoed characters


# ------------------------------------------------------------------ queue, auth, routes, error types


class _Engine:
    """An engine loop stand-in: ``max_waiting`` places; ``full`` refuses every submission."""

    def __init__(self, max_waiting: int, full: bool = False):
        self.max_waiting, self.full, self.submitted, self.cancelled = max_waiting, full, [], []
        self.num_slots = 0  # every request waits: the call holds max_waiting at most

    def submit(self, request, sink) -> None:
        if self.full:
            raise EngineOverloaded("the waiting queue is full")
        self.submitted.append(request.request_id)

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


def _start(engine: _Engine, count: int) -> None:
    requests = [SimpleNamespace(request_id=f"r{i}") for i in range(count)]

    async def start():
        Submission(engine, ServerMetrics(active=lambda: 0, waiting=lambda: 0), requests).start()

    asyncio.run(start())


def test_a_call_may_ask_for_as_many_completions_as_the_queue_holds():
    engine = _Engine(max_waiting=3)
    _start(engine, 3)
    assert engine.submitted == ["r0", "r1", "r2"]
    error = _refused(_start, _Engine(max_waiting=3), 4)
    assert (error.status, error.code) == (400, "too_many_completions")


def test_a_full_queue_is_a_429_that_says_when_to_retry():
    error = _refused(_start, _Engine(max_waiting=8, full=True), 1)
    assert (error.status, error.code) == (429, "queue_full")
    assert error.headers == {"Retry-After": "1"}


@pytest.mark.parametrize("header", ["Bearer k3y", "bearer k3y", "BEARER k3y"])
def test_the_bearer_scheme_is_case_insensitive(header):
    check = _api_key_check(SimpleNamespace(api_key="k3y"))
    asyncio.run(check(SimpleNamespace(headers={"authorization": header})))  # RFC 7235: schemes ignore case
    error = _refused(asyncio.run, check(SimpleNamespace(headers={"authorization": "Bearer nope"})))
    assert (error.status, error.type, error.code) == (401, "invalid_request_error", "invalid_api_key")


def test_model_routes_count_under_one_label():
    assert route_label("/v1/models/tiny-k3") == route_label("/v1/models/org/name") == "/v1/models/{model}"
    assert route_label("/v1/completions") == "/v1/completions" and route_label("/v2/x") == "other"


# ------------------------------------------------------------------ /metrics


def _series(metrics: ServerMetrics) -> dict[str, float]:
    lines = metrics.render().splitlines()
    return {k: float(v) for k, _, v in (x.rpartition(" ") for x in lines if not x.startswith("#"))}


def test_finished_requests_feed_the_token_counters_and_the_per_token_time():
    metrics = ServerMetrics(active=lambda: 0, waiting=lambda: 0)
    metrics.record_finished("stop", 7, 3, {"time_to_first_token_s": 0.1, "decode_time_s": 1.0})
    series = _series(metrics)
    assert series["nonstop_prompt_tokens_total"] == 7 and series["nonstop_generation_tokens_total"] == 3
    assert series["nonstop_time_per_output_token_seconds_sum"] == 0.5  # 1 s over the 2 tokens after the first
    assert series["nonstop_request_latency_seconds_sum"] == pytest.approx(1.1)


def test_a_value_on_a_bucket_bound_falls_in_that_bucket():
    metrics = ServerMetrics(active=lambda: 0, waiting=lambda: 0)
    metrics.record_finished("stop", 1, 1, {"time_to_first_token_s": 0.1, "decode_time_s": 0.0})
    series = _series(metrics)
    assert series['nonstop_time_to_first_token_seconds_bucket{le="0.1"}'] == 1  # Prometheus buckets are <= le
    assert series['nonstop_time_to_first_token_seconds_bucket{le="0.05"}'] == 0


# ------------------------------------------------------------------ request fields


def _parse(body_type, **fields):
    base = {"model": "m", "prompt": "hi"} if body_type is CompletionBody else {"model": "m", "messages": HELLO}
    return parse_body(json.dumps({**base, **fields}).encode(), body_type, Limits(max_len=100))


HELLO = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "body_type, field, fine, refused",
    [
        (CompletionBody, "logprobs", 20, 21),  # OpenAI: at most 20 (the engine alone would take more)
        (ChatCompletionBody, "top_logprobs", 20, 21),
        (CompletionBody, "stop", ["s"] * 16, ["s"] * 17),
        (CompletionBody, "stop_token_ids", list(range(64)), list(range(65))),
        (ChatCompletionBody, "modalities", ["text"], ["text", "audio"]),
        (ChatCompletionBody, "tool_choice", "auto", {"type": "function", "function": {"name": "f"}}),
    ],
)
def test_field_limits_the_engine_would_not_catch(body_type, field, fine, refused):
    extra = {"logprobs": True} if field == "top_logprobs" else {}
    assert getattr(_parse(body_type, **extra, **{field: fine}), field) == fine
    error = _refused(lambda: _parse(body_type, **extra, **{field: refused}))
    assert (error.status, error.param) == (400, field)


def test_a_messages_name_reaches_the_chat_template():
    message = ChatMessage(role="user", content="hi", name="ann")
    assert message.for_template() == {"role": "user", "content": "hi", "name": "ann"}


def test_a_chat_context_error_names_max_completion_tokens_when_that_was_sent():
    tok = ByteTokenizer(320)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    body = _parse(ChatCompletionBody, max_completion_tokens=99)  # 2 prompt tokens + 99 > 100
    error = _refused(chat_requests, body, SimpleNamespace(tokenizer=tok), Limits(max_len=100), "chatcmpl-x")
    assert (error.param, error.code) == ("max_completion_tokens", "context_length_exceeded")
