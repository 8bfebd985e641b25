"""Property-based fuzzing of a live server (127.0.0.1): bodies mixing valid fields with wrong types,
extreme numbers, unicode edge cases (lone and paired surrogates, NUL, bidi controls), unknown fields,
deep nesting, oversized bodies, streams abandoned midway and clients that give up. Every response is
a 2xx or a 4xx with an OpenAI error body, never a 5xx; afterwards no slot is held and a fixed greedy
request returns exactly what it returned before. Bounded: ``EXAMPLES`` cases and ``BUDGET_S`` seconds, the
same cases every run; a longer, fresh campaign: NONSTOP_FUZZ_EXAMPLES=2000 NONSTOP_FUZZ_RANDOM=1 pytest this file."""

from __future__ import annotations

import collections
import json
import os
import time

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.conftest import MODEL_NAME

EXAMPLES = int(os.environ.get("NONSTOP_FUZZ_EXAMPLES", 150))
BUDGET_S = 90.0 if "NONSTOP_FUZZ_EXAMPLES" not in os.environ else 3600.0

EDGE_TEXT = [
    "",
    " ",
    "\x00",
    "\ud800",
    "\udfff",
    "a\ud83d",
    "\ud83d\ude00",
    "😀",
    "\u202eevil",
    "\ufeff",
    "e\u0301",
    "\r\n",
    "<|im_end|>",
    "[EOS]",
    "{{ 7*7 }}",
    "%s%n",
    "\\",
    '"',
    "x" * 3000,
    "中文" * 50,
]
EDGE_NUMBERS = [
    0,
    -1,
    1,
    2,
    -0.0,
    1e-300,
    5e-324,
    1e-46,
    0.5,
    1.0000001,
    2.0000001,
    1e308,
    -1e308,
    2**31,
    2**63,
    2**64,
    -(2**63) - 1,
    10**30,
    10**400,
]


def _nested(depth: int):
    value = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


text = st.one_of(
    st.sampled_from(EDGE_TEXT),
    st.text(max_size=40),
    st.text(alphabet=st.characters(min_codepoint=0xD700, max_codepoint=0xE100), max_size=8),
)
number = st.one_of(
    st.sampled_from(EDGE_NUMBERS), st.integers(-(10**25), 10**25), st.floats(allow_nan=False, allow_infinity=False)
)
garbage = st.one_of(
    st.none(),
    st.booleans(),
    number,
    text,
    st.lists(st.integers(-5, 400), max_size=4),
    st.dictionaries(text, st.integers(), max_size=2),
    st.integers(40, 1500).map(_nested),
)


def _encodable(t: str) -> bool:
    try:
        return bool(t.encode("utf-8"))
    except UnicodeEncodeError:
        return False


clean_text = st.one_of(
    st.sampled_from([t for t in EDGE_TEXT if _encodable(t)]),
    st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=30),
)
token_ids = st.lists(st.integers(0, 319), min_size=1, max_size=20)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "developer"]),
        "content": st.one_of(
            clean_text,
            st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": clean_text}), min_size=1, max_size=2),
        ),
    }
)
# field -> values a valid request may carry (garbage is drawn beside them)
VALID = {
    "temperature": st.one_of(st.sampled_from([0, 1e-300, 5e-324, 1e-30, 0.7, 2.0]), st.floats(0, 2)),
    "top_p": st.one_of(st.sampled_from([1e-46, 5e-324, 0.5, 1.0]), st.floats(1e-300, 1)),
    "top_k": st.integers(-1, 400),
    "min_p": st.floats(0, 1),
    "repetition_penalty": st.floats(0.01, 5),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "n": st.integers(1, 3),
    "seed": st.integers(-(2**63), 2**64 - 1),
    "stop": st.one_of(clean_text, st.lists(clean_text, max_size=3)),
    "stop_token_ids": st.lists(st.integers(0, 400), max_size=3),
    "ignore_eos": st.booleans(),
    "user": clean_text,
    "max_tokens": st.integers(1, 6),
    "logprobs": st.integers(0, 20),
    "echo": st.booleans(),
    "prompt": st.one_of(
        clean_text, st.lists(clean_text, min_size=1, max_size=3), token_ids, st.lists(token_ids, min_size=1, max_size=2)
    ),
    "messages": st.lists(message, min_size=1, max_size=3),
    "top_logprobs": st.integers(0, 20),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "metadata": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
}
CHAT_ONLY = ("messages", "top_logprobs", "tools", "response_format")
COMPLETION_ONLY = ("prompt", "echo", "best_of")
FIELDS = sorted(set(VALID) | {"logit_bias", "tools", "response_format", "best_of"})


@st.composite
def call(draw):
    chat = draw(st.booleans())
    clean = draw(st.integers(0, 2)) > 0  # two thirds: every value valid (the engine runs); else garbage too
    main = "messages" if chat else "prompt"
    allowed = [f for f in FIELDS if f not in (COMPLETION_ONLY if chat else CHAT_ONLY) and f not in (main, "max_tokens")]

    def value(name):
        if clean and name in VALID:
            return draw(VALID[name])
        return draw(st.one_of(VALID[name], garbage) if name in VALID else garbage)

    body = {"model": MODEL_NAME if clean else draw(st.sampled_from([MODEL_NAME] * 8 + ["other", "\ud800", ""]))}
    for name in (main, "max_tokens"):
        if clean or draw(st.integers(0, 9)):
            body[name] = value(name)
    for name in draw(st.lists(st.sampled_from(allowed), max_size=4, unique=True)):
        if not clean or name in VALID:
            body[name] = value(name)
    if body.get("logprobs") is not None and chat:
        body["logprobs"] = draw(st.booleans())
    if not clean and draw(st.integers(0, 4)) == 0:
        body[draw(st.sampled_from(["max_token", "\u0000", "a" * 200, "extra"]))] = draw(garbage)
    mode = draw(st.sampled_from(["whole"] * 4 + ["stream"] * 3 + ["abandon", "give_up", "huge", "raw"]))
    if mode in ("stream", "abandon"):
        body["stream"] = True if clean else draw(st.one_of(st.just(True), garbage))
    raw = None
    if mode == "huge":
        raw = json.dumps({**body, "pad": "y" * (2 << 20)}).encode()
    elif mode == "raw":
        raw = draw(
            st.sampled_from(
                [
                    b"",
                    b"{",
                    b"[]",
                    b"null",
                    b'{"model": NaN}',
                    b"\xff\xfe",
                    b'{"a":' * 5000,
                    json.dumps(body).encode()[: draw(st.integers(0, 40))],
                ]
            )
        )
    return ("/chat/completions" if chat else "/completions"), body, mode, raw


def _check_response(r: httpx.Response, seen: collections.Counter) -> None:
    seen[r.status_code] += 1
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        error = r.json()["error"]
        assert error["message"] and set(error) == {"message", "type", "param", "code"}


def _greedy(http: httpx.Client, server) -> list:
    body = {
        "model": MODEL_NAME,
        "prompt": "Fixed prompt",
        "max_tokens": 12,
        "temperature": 0,
        "logprobs": 1,
        "ignore_eos": True,
    }
    r = http.post(server.api + "/completions", json=body)
    assert r.status_code == 200
    c = r.json()["choices"][0]
    return [c["text"], c["logprobs"]["tokens"], c["logprobs"]["token_logprobs"]]


def test_fuzzed_requests_never_get_a_5xx(server):
    started = time.monotonic()
    seen = collections.Counter()
    with httpx.Client(timeout=60) as http:
        before = _greedy(http, server)
        errors_before = server.metric('nonstop_requests_total{endpoint="/v1/completions",status="500"}')

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize="NONSTOP_FUZZ_RANDOM" not in os.environ,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(call())
        def one(case):
            if time.monotonic() - started > BUDGET_S:
                return
            seen["cases"] += 1
            path, body, mode, raw = case
            content = raw if raw is not None else json.dumps(body).encode()
            headers = {"content-type": "application/json"}
            url = server.api + path
            if mode == "give_up":  # the client leaves before the answer
                try:
                    http.post(url, content=content, headers=headers, timeout=httpx.Timeout(10, read=0.05))
                except httpx.ReadTimeout:
                    seen["gave up"] += 1
                return
            if body.get("stream") is True and mode in ("stream", "abandon") and raw is None:
                with http.stream("POST", url, content=content, headers=headers) as r:
                    if r.status_code != 200:
                        r.read()
                        return _check_response(r, seen)
                    seen["stream"] += 1
                    lines = 0
                    for line in r.iter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            event = json.loads(line[6:])
                            assert "error" not in event, event
                        lines += 1
                        if mode == "abandon" and lines >= 2:
                            break
                return
            _check_response(http.post(url, content=content, headers=headers), seen)

        one()
        # it reached the engine and the checks (counted over the cases the time budget let run)
        assert seen["cases"] >= min(EXAMPLES, 50), f"only {seen['cases']} cases ran within {BUDGET_S} s: {seen}"
        assert seen[200] > seen["cases"] // 5 and seen[400] and seen["stream"], seen
        assert server.wait_idle() == 0, "a slot is still held after the campaign"
        assert server.healthy()
        assert _greedy(http, server) == before
        for endpoint in ("/v1/completions", "/v1/chat/completions"):
            assert server.metric(f'nonstop_requests_total{{endpoint="{endpoint}",status="500"}}') == (
                errors_before if endpoint == "/v1/completions" else 0
            )
