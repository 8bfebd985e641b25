"""Each 5xx and gap found by fuzzing the server (issue 13), reproduced with its original input."""

from __future__ import annotations

import gc
import json
import socket
import threading
import time

import httpx
import pytest

from nonstop.engine.llm import LLM
from nonstop.engine.sampling import SamplingParams
from nonstop.server import build_context
from tests.server.conftest import MODEL_NAME, start_server, stop_server
from tests.server.inprocess import serve_in_thread


def _post(server, path: str, body, **kw) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        server.api + path, content=content, headers={"content-type": "application/json"}, timeout=60, **kw
    )


def _error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def _completion(server, **kw) -> dict:
    r = _post(
        server, "/completions", {"model": MODEL_NAME, "prompt": "The sea", "max_tokens": 8, "ignore_eos": True, **kw}
    )
    assert r.status_code == 200, r.text
    return r.json()


def _chat(server, **kw) -> dict:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "The sea"}],
        "max_tokens": 8,
        "ignore_eos": True,
    }
    r = _post(server, "/chat/completions", {**body, **kw})
    assert r.status_code == 200, r.text
    return r.json()


# ------------------------------------------------------------------ sampling at extreme values


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": 1e-300},
        {"temperature": 5e-324},
        {"temperature": 1.0, "top_p": 1e-46},
        {"temperature": 2.0, "top_p": 5e-324},
        {"temperature": 1e-30, "top_k": 1, "min_p": 1.0},
    ],
)
def test_any_positive_temperature_and_top_p_work_and_tend_to_greedy(server, kw):
    """These were 500s ("probability tensor contains inf/nan"): the filtered set is the top token alone."""
    greedy_c, greedy_chat = _completion(server, temperature=0), _chat(server, temperature=0)
    assert _completion(server, seed=3, **kw)["choices"][0]["text"] == greedy_c["choices"][0]["text"]
    assert _chat(server, seed=3, **kw)["choices"][0]["message"] == greedy_chat["choices"][0]["message"]


# ------------------------------------------------------------------ odd input that used to crash


def _raw(template: str) -> bytes:
    """A JSON body spelled by hand (json.dumps would refuse what we want to send)."""
    return template.replace("MODEL", MODEL_NAME).encode()


@pytest.mark.parametrize(
    "path, raw, param",
    [
        ("/completions", '{"model": "MODEL", "prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
        ("/completions", '{"model": "MODEL", "prompt": ["ok", "\\udfff"], "max_tokens": 2}', "prompt[1]"),
        ("/completions", '{"model": "MODEL", "prompt": "a", "stop": ["\\ud83d"], "max_tokens": 2}', "stop[0]"),
        ("/completions", '{"model": "\\ud800", "prompt": "a"}', "model"),
        ("/completions", '{"model": "MODEL", "prompt": "a", "user": "\\udc80"}', "user"),
        (
            "/chat/completions",
            '{"model": "MODEL", "messages": [{"role": "user", "content": "x\\ud800"}]}',
            "messages[0].content",
        ),
        (
            "/chat/completions",
            '{"model": "MODEL", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
            "messages[0].content[0].text",
        ),
    ],
)
def test_lone_surrogates_are_a_400(server, path, raw, param):
    _error(_post(server, path, _raw(raw)), 400, param)
    assert server.healthy()


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_seeds_beyond_64_bits_are_a_400_naming_seed(server, path):
    body = {
        "model": MODEL_NAME,
        "prompt": "a",
        "messages": [{"role": "user", "content": "a"}],
        "max_tokens": 2,
        "temperature": 0.8,
    }
    body.pop("messages" if path == "/completions" else "prompt")
    for seed in (2**64, -(2**63) - 1, 10**40):
        _error(_post(server, path, {**body, "seed": seed}), 400, "seed")
    for seed in (2**64 - 1, -(2**63), 0):
        assert _post(server, path, {**body, "seed": seed}).status_code == 200


@pytest.mark.parametrize("depth", [40, 1000, 100_000])
def test_deep_nesting_is_a_400(server, depth):
    raw = '{"model": "MODEL", "prompt": ' + "[" * depth + "1" + "]" * depth + "}"
    _error(_post(server, "/completions", _raw(raw)), 400)
    raw = (
        '{"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "metadata": '
        + '{"a": ' * depth
        + "1"
        + "}" * depth
        + "}"
    )
    _error(_post(server, "/chat/completions", _raw(raw)), 400)
    assert server.healthy()


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_non_finite_numbers_are_a_400(server, value):
    _error(_post(server, "/completions", _raw('{"model": "MODEL", "prompt": "a", "temperature": ' + value + "}")), 400)


# ------------------------------------------------------------------ headers, routes, schema


def test_405_says_which_methods_are_allowed(server):
    r = httpx.get(server.api + "/completions")
    _error(r, 405)
    assert "POST" in r.headers["allow"]
    r = httpx.delete(server.api + "/models")
    _error(r, 405)
    assert "GET" in r.headers["allow"]


def test_model_by_id(server):
    assert httpx.get(f"{server.api}/models/{MODEL_NAME}").json()["id"] == MODEL_NAME
    assert server.client().models.retrieve(MODEL_NAME).id == MODEL_NAME
    _error(httpx.get(server.api + "/models/other/with-slash"), 404, "model")


def test_openapi_describes_the_request_bodies(server):
    doc = httpx.get(server.url + "/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for path, required in (("/v1/completions", {"model", "prompt"}), ("/v1/chat/completions", {"model", "messages"})):
        ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        body = schemas[ref.rsplit("/", 1)[1]]
        assert set(body["required"]) == required
        assert {"temperature", "top_p", "max_tokens", "stream", "n", "seed"} <= set(body["properties"])
        assert body.get("additionalProperties") is False
    assert "ChatMessage" in schemas and "/v1/models/{model_id}" in doc["paths"]


# ------------------------------------------------------------------ field policy, n, penalties


def test_one_policy_for_fields(server):
    """Unknown: refused; OpenAI fields that do not change the output: accepted; ones we cannot honour:
    refused when set; vLLM's sampling extensions: honoured."""
    e = _error(_post(server, "/completions", {"model": MODEL_NAME, "prompt": "a", "max_token": 3}), 400, "max_token")
    assert e["code"] == "unknown_parameter"
    ok = {"user": "u", "metadata": {"k": "v"}, "store": False, "service_tier": "auto"}
    assert _post(server, "/completions", {"model": MODEL_NAME, "prompt": "a", "max_tokens": 2, **ok}).status_code == 200
    for field, value in (("logit_bias", {"5": 1.0}), ("suffix", "x"), ("best_of", 3)):
        e = _error(_post(server, "/completions", {"model": MODEL_NAME, "prompt": "a", field: value}), 400, field)
        assert e["code"] == "unsupported_parameter"
    ext = {"min_p": 0.1, "repetition_penalty": 1.2, "top_k": 5, "presence_penalty": 0.5, "frequency_penalty": 0.5}
    assert (
        _post(server, "/completions", {"model": MODEL_NAME, "prompt": "a", "max_tokens": 2, **ext}).status_code == 200
    )


def test_n_completions_per_prompt(server):
    out = _completion(server, n=3, temperature=1.0, seed=11, max_tokens=6)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert out["usage"]["prompt_tokens"] == len("The sea") and out["usage"]["completion_tokens"] == 18
    assert len({c["text"] for c in out["choices"]}) > 1  # independent draws
    two = _post(
        server,
        "/completions",
        {"model": MODEL_NAME, "prompt": ["ab", "xyz"], "n": 2, "max_tokens": 2, "echo": True, "temperature": 0},
    ).json()
    assert [c["text"][:2] for c in sorted(two["choices"], key=lambda c: c["index"])] == ["ab", "ab", "xy", "xy"]
    assert two["usage"]["prompt_tokens"] == 5
    chunks = list(
        server.client().chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "hi"}],
            n=2,
            max_tokens=3,
            stream=True,
            temperature=0.7,
        )
    )
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}


def test_penalties_and_min_p_give_the_engines_tokens(server, model_dir):
    """Server and offline engine agree token for token, and the penalties change greedy output."""
    params = dict(
        max_tokens=24, temperature=0, repetition_penalty=1.5, presence_penalty=0.7, frequency_penalty=0.6, min_p=0.05
    )
    served = _completion(server, **params)["choices"][0]["text"]
    llm = LLM(model_dir, dtype="float32", max_batch=1)
    offline = llm.generate(["The sea"], SamplingParams(ignore_eos=True, **params))[0].text
    plain = llm.generate(["The sea"], SamplingParams(ignore_eos=True, max_tokens=24, temperature=0))[0].text
    assert served == offline != plain


# ------------------------------------------------------------------ defaults, auth, overload


def test_generation_config_defaults_and_the_api_key(model_dir, tmp_path):
    """generation_config.json's max_new_tokens bounds requests without max_tokens (a chat no longer runs
    to the end of the context); its sampling fields are the defaults; --api-key guards /v1."""
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(model_dir, ckpt)
    (ckpt / "generation_config.json").write_text(json.dumps({"max_new_tokens": 5, "do_sample": False}))
    s = start_server(ckpt, tmp_path, "--api-key", "sekret")
    try:
        auth = {"authorization": "Bearer sekret"}
        _error(httpx.get(s.api + "/models"), 401)
        _error(httpx.get(s.api + "/models", headers={"authorization": "Bearer wrong"}), 401)
        assert httpx.get(s.url + "/health").status_code == 200 and httpx.get(s.url + "/metrics").status_code == 200
        chat = httpx.post(
            s.api + "/chat/completions",
            headers=auth,
            timeout=60,
            json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True},
        ).json()
        assert chat["usage"]["completion_tokens"] == 5
        body = {"model": MODEL_NAME, "prompt": "hello", "ignore_eos": True}
        a = httpx.post(s.api + "/completions", headers=auth, json=body, timeout=60).json()
        b = httpx.post(s.api + "/completions", headers=auth, json={**body, "temperature": 0}, timeout=60).json()
        assert (
            a["usage"]["completion_tokens"] == 5 and a["choices"][0]["text"] == b["choices"][0]["text"]
        )  # greedy default
        import openai

        client = openai.OpenAI(base_url=s.api, api_key="sekret", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == [MODEL_NAME]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.api, api_key="nope", max_retries=0).models.list()
    finally:
        stop_server(s)


# ------------------------------------------------------------------ in-process: injected fault, slow tokenizer


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, dtype="float32", max_batch=4)


def _http_exchange(port: int, requests: list[bytes]) -> list[bytes]:
    """Send HTTP/1.1 requests one after another on ONE connection; the raw responses."""
    out = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        reader = sock.makefile("rb")
        for raw in requests:
            sock.sendall(raw)
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = reader.readline()
                assert line, "the server closed the connection"
                head += line
            length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
            out.append(head + reader.read(length))
    return out


def _request(path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data


def test_an_unhandled_error_is_a_counted_500_and_the_connection_survives(llm, monkeypatch):
    import nonstop.server.app as app_module

    real = app_module.completion_requests

    def flaky(body, *args):
        if body.prompt == "boom":
            raise RuntimeError("injected fault")
        return real(body, *args)

    monkeypatch.setattr(app_module, "completion_requests", flaky)
    ctx = build_context(llm, [MODEL_NAME], max_batch=2)
    with serve_in_thread(ctx) as url:
        port = int(url.rsplit(":", 1)[1])
        boom = _request("/v1/completions", {"model": MODEL_NAME, "prompt": "boom", "max_tokens": 2})
        fine = _request("/v1/completions", {"model": MODEL_NAME, "prompt": "fine", "max_tokens": 2})
        first, second = _http_exchange(port, [boom, fine])
        assert first.startswith(b"HTTP/1.1 500") and b'"internal_error"' in first and b"Traceback" not in first
        assert second.startswith(b"HTTP/1.1 200")
        metrics = httpx.get(url + "/metrics").text
        assert 'nonstop_requests_total{endpoint="/v1/completions",status="500"} 1' in metrics


def _full_collection_s() -> float:
    t0 = time.perf_counter()
    gc.collect()
    return time.perf_counter() - t0


def test_a_full_collection_while_serving_skips_the_startup_heap(llm):
    """A full GC stops the event loop for as long as it walks the heap; while the server runs, the heap
    it started with is frozen (1M extra objects here), and it is given back to the collector after."""
    heap = [{"i": [i]} for i in range(1_000_000)]
    before = gc.get_freeze_count()
    with serve_in_thread(build_context(llm, [MODEL_NAME], max_batch=2)) as url:
        assert gc.get_freeze_count() > len(heap)
        serving = min(_full_collection_s() for _ in range(3))
        assert httpx.get(url + "/health", timeout=10).status_code == 200
    assert gc.get_freeze_count() == before
    stopped = min(_full_collection_s() for _ in range(3))
    assert serving < stopped / 5, (serving, stopped)
    del heap


def test_a_huge_prompt_is_tokenized_off_the_event_loop(llm):
    """While a prompt near the body limit is being tokenized (held there until the test lets it go),
    /health answers: tokenizing on the event loop would leave it unanswered. No clock: a busy host only
    slows both."""
    ctx = build_context(llm, [MODEL_NAME], max_batch=2)
    tok = llm.tokenizer
    real = tok.encode
    started, release = threading.Event(), threading.Event()

    def held_encode(text, *a, **kw):
        if len(text) > 100_000:
            started.set()
            release.wait(60)
        return real(text, *a, **kw)

    tok.encode = held_encode
    try:
        with serve_in_thread(ctx) as url:
            body = {"model": MODEL_NAME, "prompt": "x" * 900_000, "max_tokens": 2}
            big = {}
            t = threading.Thread(
                target=lambda: big.update(r=httpx.post(url + "/v1/completions", json=body, timeout=120))
            )
            t.start()
            try:
                assert started.wait(60), "the prompt never reached the tokenizer"
                for _ in range(3):
                    assert httpx.get(url + "/health", timeout=30).status_code == 200
                assert not release.is_set() and t.is_alive()  # answered while the tokenizer was held
            finally:
                release.set()
            t.join(60)
            _error(big["r"], 400)  # longer than the context
    finally:
        del tok.encode
