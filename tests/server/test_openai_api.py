"""The OpenAI endpoints through the official ``openai`` client against a live server."""

from __future__ import annotations

import httpx

from tests.server.conftest import MODEL_NAME


def test_models_and_health(server):
    client = server.client()
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    log = server.log.read_text()
    assert "warmed up in" in log and log.index("warmed up in") < log.index("nonstop: serving")  # before it listens


def test_streaming_chat_matches_the_whole_response(server):
    client = server.client()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
    whole = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0)
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == whole.choices[0].message.content
    assert reasons == [whole.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 8
    rendered = "<|system|>Be brief.\n<|user|>Say something.\n<|assistant|>"  # the checkpoint's chat template
    assert whole.usage.prompt_tokens == len(rendered.encode()) == chunks[-1].usage.prompt_tokens


def test_completions_whole_streamed_and_with_logprobs(server):
    client = server.client()
    prompt = "Once upon a time"
    whole = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0, logprobs=2)
    streamed = list(
        client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text
    assert whole.usage.prompt_tokens == len(prompt) and whole.usage.completion_tokens == 6
    assert whole.usage.total_tokens == len(prompt) + 6
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 6 and all(v <= 0 for v in lp.token_logprobs)
    echoed = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + whole.choices[0].text


def test_several_prompts_token_ids_and_a_chunked_long_prompt(server):
    client = server.client()
    long_prompt = "lorem ipsum dolor sit amet " * 6  # 162 tokens: 21 prefill chunks of 8
    out = client.completions.create(model=MODEL_NAME, prompt=[long_prompt, "short"], max_tokens=3, temperature=0)
    assert sorted(c.index for c in out.choices) == [0, 1]
    assert out.usage.prompt_tokens == len(long_prompt) + 5 and out.usage.completion_tokens == 6
    by_ids = client.completions.create(model=MODEL_NAME, prompt=list(b"short"), max_tokens=3, temperature=0)
    assert by_ids.choices[0].text == next(c.text for c in out.choices if c.index == 1)


def test_sampling_with_a_seed_is_reproducible(server):
    client = server.client()
    kw = dict(model=MODEL_NAME, prompt="Seeded", max_tokens=8, temperature=0.9, top_p=0.95, seed=7, logprobs=0)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].logprobs.token_logprobs == b.choices[0].logprobs.token_logprobs


def test_streamed_text_with_a_stop_string_equals_the_whole_text(server):
    client = server.client()
    base = dict(model=MODEL_NAME, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    for prompt in ("Stop strings", "Another prompt", "Third try"):
        text = client.completions.create(prompt=prompt, **base).choices[0].text
        if len(text) >= 6:
            break
    stop = text[3:5]
    assert stop, "the random model produced too little visible text for this test"
    whole = client.completions.create(prompt=prompt, stop=[stop], **base).choices[0]
    pieces = list(client.completions.create(prompt=prompt, stop=[stop], stream=True, **base))
    assert whole.text == text[: text.find(stop)] and whole.finish_reason == "stop"
    assert "".join(c.choices[0].text for c in pieces) == whole.text
