"""What OpenAI / vLLM clients send and expect, beyond the basics: null fields, continuous usage in streams,
prompt scoring with echo + logprobs + max_tokens 0 (lm-evaluation-harness), error fields that name the
client's own parameter, HEAD probes."""

from __future__ import annotations

import json

import httpx
import pytest

from nonstop.engine.llm import LLM
from nonstop.engine.sampling import SamplingParams
from tests.server.conftest import MAX_MODEL_LEN, MODEL_NAME


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.api + path, json=body, timeout=60)


def _error(response: httpx.Response, param: str) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    return error


def _events(response: httpx.Response) -> list[dict]:
    lines = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


@pytest.mark.parametrize(
    "path, nulls",
    [
        ("/completions", {"stream": None, "n": None, "ignore_eos": None, "echo": None, "logprobs": None}),
        ("/chat/completions", {"stream": None, "n": None, "ignore_eos": None, "logprobs": None, "seed": None}),
    ],
)
def test_null_fields_take_their_defaults(server, path, nulls):
    body = {"model": MODEL_NAME, "max_tokens": 4, "temperature": 0}
    body |= {"prompt": "The sea"} if path == "/completions" else {"messages": [{"role": "user", "content": "Hi"}]}
    plain = _post(server, path, body)
    with_nulls = _post(server, path, {**body, **nulls})
    assert plain.status_code == with_nulls.status_code == 200, with_nulls.text
    pick = (lambda c: c["text"]) if path == "/completions" else (lambda c: c["message"]["content"])
    assert [pick(c) for c in with_nulls.json()["choices"]] == [pick(c) for c in plain.json()["choices"]]
    _error(_post(server, path, {**body, "model": None}), "model")  # a required field sent as null is missing


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(server):
    body = {"model": MODEL_NAME, "prompt": "The sea", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    opts = {"include_usage": True, "continuous_usage_stats": True}
    events = _events(_post(server, "/completions", {**body, "stream": True, "stream_options": opts}))
    content = [e for e in events if e["choices"]]
    assert content and all("usage" in e for e in content)
    counts = [e["usage"]["completion_tokens"] for e in content]
    assert counts == sorted(counts) and counts[-1] == 6
    assert events[-1]["choices"] == [] and events[-1]["usage"] == content[-1]["usage"]
    plain = _events(_post(server, "/completions", {**body, "stream": True}))  # no stream_options: no usage
    assert not any("usage" in e for e in plain)


def test_chat_stream_with_continuous_usage_opens_with_a_null_usage(server):
    """The role chunk goes out before the engine has counted anything: its usage is null; every chunk after
    it carries the counts so far, the prompt's included."""
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    body |= {"temperature": 0, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    events = _events(_post(server, "/chat/completions", body))
    assert events[0]["choices"][0]["delta"].get("role") == "assistant" and events[0]["usage"] is None
    later = [e["usage"] for e in events[1:]]
    assert later and all(u["prompt_tokens"] > 0 for u in later)
    assert later[-1]["completion_tokens"] == 3


def test_the_model_card_reports_the_served_context(server):
    """The server runs with --max-model-len below the model's positions: the card says what it serves."""
    card = httpx.get(server.api + "/models", timeout=10).json()["data"][0]
    assert card["max_model_len"] == MAX_MODEL_LEN


def test_echo_with_max_tokens_0_scores_the_prompt_as_decode_would(server, model_dir):
    """lm-evaluation-harness' loglikelihood request. The server scores the prompt in prefill chunks; the
    offline engine's greedy decode steps produced its last 5 tokens one by one, each with its logprob:
    they must agree."""
    prefix = list(b"The sea was")
    llm = LLM(model_dir, dtype="float32", max_batch=1)
    greedy = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=0)
    out = llm.generate(prompt_token_ids=[prefix], sampling=greedy)[0]
    generated, decode_logprobs = out.token_ids, [row[t] for t, row in zip(out.token_ids, out.logprobs)]
    prompt = prefix + generated
    scored = _post(
        server, "/completions", {"model": MODEL_NAME, "prompt": prompt, "echo": True, "max_tokens": 0, "logprobs": 2}
    )
    assert scored.status_code == 200, scored.text
    body = scored.json()
    choice = body["choices"][0]
    assert choice["text"] == llm.tokenizer.decode(prompt)  # the prompt and nothing generated
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 16, "completion_tokens": 0, "total_tokens": 16}
    lp = choice["logprobs"]
    assert lp["tokens"] == [llm.tokenizer.token_text(i) for i in prompt]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # the first token has no context
    assert lp["token_logprobs"][-5:] == pytest.approx(decode_logprobs, abs=2e-3)
    for token, top in zip(lp["tokens"][1:], lp["top_logprobs"][1:]):
        assert token in top and len(top) >= 2  # the actual token and the 2 best

    streamed = _events(
        _post(
            server,
            "/completions",
            {"model": MODEL_NAME, "prompt": prompt, "echo": True, "max_tokens": 0, "logprobs": 2, "stream": True},
        )
    )
    texts = "".join(e["choices"][0]["text"] for e in streamed)
    assert texts == choice["text"]
    first = streamed[0]["choices"][0]["logprobs"]
    assert first["tokens"] == lp["tokens"] and first["token_logprobs"][1:] == pytest.approx(lp["token_logprobs"][1:])


def test_echo_with_logprobs_and_generation_lists_prompt_then_output(server):
    body = {"model": MODEL_NAME, "prompt": "The sea", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    plain = _post(server, "/completions", {**body, "logprobs": 1}).json()["choices"][0]
    echoed = _post(server, "/completions", {**body, "logprobs": 1, "echo": True}).json()["choices"][0]
    assert echoed["text"] == "The sea" + plain["text"]
    assert echoed["logprobs"]["tokens"] == list("The sea") + plain["logprobs"]["tokens"]
    assert echoed["logprobs"]["token_logprobs"][-3:] == pytest.approx(plain["logprobs"]["token_logprobs"])
    assert echoed["logprobs"]["text_offset"][-3:] == [7 + o for o in plain["logprobs"]["text_offset"]]


def test_errors_name_the_clients_parameter(server):
    chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "word " * (MAX_MODEL_LEN + 10)}]}
    assert _error(_post(server, "/chat/completions", chat), "messages")["code"] == "context_length_exceeded"
    base = {"model": MODEL_NAME, "prompt": "The sea", "max_tokens": 2}
    _error(_post(server, "/completions", {**base, "max_tokens": 0}), "max_tokens")  # 0 only with echo
    _error(_post(server, "/completions", {**base, "stop": 5}), "stop")
    mixed = _error(_post(server, "/completions", {**base, "prompt": ["a", [1, 2]]}), "prompt")
    assert "list of strings" in mixed["message"]
    _error(_post(server, "/completions", {**base, "stop_token_ids": [2, 10**6]}), "stop_token_ids")
    image = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    err = _error(
        _post(server, "/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": image}]}),
        "messages[0].content",
    )
    assert "'image_url'" in err["message"] and "not supported" in err["message"]
    untyped = [{"text": "hi"}]  # the message was "Input should be a valid string"
    err = _error(
        _post(server, "/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": untyped}]}),
        "messages[0].content",
    )
    assert 'needs a "type"' in err["message"]


def test_health_answers_head_probes(server):
    assert httpx.head(server.url + "/health", timeout=10).status_code == 200
