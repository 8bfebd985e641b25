"""``nonstop serve --speculative ngram`` over HTTP against plain decoding of the same checkpoint (``LLM``,
no speculation): stop strings and stop token ids that end a request inside an accepted draft block,
usage counts, streamed text and usage, n > 1 and a batch of prompts with logprobs, max_tokens 1, and
seeded sampling that repeats. Rows of different requests share verification forwards
(--no-batch-invariant), so padded draft rows are exercised too."""

from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from nonstop import LLM, SamplingParams  # noqa: E402
from tests.engine.tiny_models import synth_checkpoint  # noqa: E402
from tests.server.conftest import MODEL_NAME, start_server, stop_server  # noqa: E402

# the tiny random k3 repeats "a" after "aaaaaaaa", so n-gram drafts are accepted there (one per step: the
# latest earlier match of a run of one token is followed by one token only)
CASES = [
    ("aaaaaaaa", {"stop": ["aa"]}),
    ("aaaaaaaa", {"stop": ["aaaa"]}),
    ("aaaaaaaa", {"stop": ["aaaaa"]}),
    ("aaaaaaaa", {"stop": ["aaaaaaaaa"]}),
    ("abab", {}),
    ("hello hello hello hel", {}),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return synth_checkpoint("k3", tmp_path_factory.mktemp("tiny-k3"))


@pytest.fixture(scope="module")
def plain(model_dir):
    return LLM(model_dir, backend="reference", batch_invariant=True)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    s = start_server(
        model_dir,
        tmp_path_factory.mktemp("logs"),
        "--backend",
        "reference",
        "--no-warmup",
        "--no-batch-invariant",
        "--speculative",
        "ngram",
        "--num-draft-tokens",
        "5",
    )
    try:
        yield s
    finally:
        stop_server(s)


def post(server, body: dict) -> dict:
    r = httpx.post(server.api + "/completions", json={"model": MODEL_NAME, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def stream(server, body: dict) -> list[dict]:
    body = {"model": MODEL_NAME, **body, "stream": True, "stream_options": {"include_usage": True}}
    r = httpx.post(server.api + "/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    lines = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def oracle(plain, prompt: str, extra: dict, max_tokens: int = 12):
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0, ignore_eos=True, stop=extra.get("stop"), logprobs=extra.get("logprobs")
    )
    return plain.generate([prompt], params)[0]


def test_the_stops_land_inside_accepted_draft_blocks(model_dir):
    """Guards the premise of the server tests below: under n-gram speculation the "aaaaaaaa" cases end
    by a stop string in a block whose drafts were accepted (not at a block's edge by luck): the last step
    emitted only accepted drafts (no correction or bonus token), so accepted + steps = tokens, not tokens - 1."""
    llm = LLM(model_dir, backend="reference", speculative={"method": "ngram", "num_tokens": 5})
    out = llm.generate(["aaaaaaaa"], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=["aaaa"]))[0]
    assert out.finish_reason == "stop" and len(out.token_ids) == 4
    assert out.metrics["accepted_tokens"] + out.metrics["verify_steps"] == len(out.token_ids)


@pytest.mark.parametrize("prompt,extra", CASES)
def test_whole_and_streamed_completions_equal_plain_greedy(server, plain, prompt, extra):
    """Text, finish_reason and usage of a greedy request under speculation equal plain decoding's, whole
    and streamed (no duplicated or lost text, one finish_reason, the final usage chunk the same). Catches
    a stop inside a draft block that emits the rest of the block, or counts its tokens in usage."""
    want = oracle(plain, prompt, extra)
    usage = {"prompt_tokens": len(want.prompt_token_ids), "completion_tokens": len(want.token_ids)}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True, **extra}
    whole = post(server, body)
    assert whole["choices"][0]["text"] == want.text
    assert whole["choices"][0]["finish_reason"] == want.finish_reason
    assert whole["usage"] == usage
    chunks = stream(server, body)
    choices = [c["choices"][0] for c in chunks if c.get("choices")]
    assert "".join(c["text"] for c in choices) == want.text
    assert [c["finish_reason"] for c in choices if c.get("finish_reason")] == [want.finish_reason]
    assert chunks[-1]["usage"] == usage


def test_n_and_a_batch_of_prompts_with_logprobs_equal_plain(server, plain):
    """n=2 greedy completions of two prompts in one request (four rows verified together): each choice's
    text and logprobs equal plain decoding's, one logprob per completion token. Catches rows of a shared
    verification forward mixed up, and logprobs taken from the wrong verification row."""
    prompts = ["aaaaaaaa", "abab"]
    body = {"prompt": prompts, "n": 2, "max_tokens": 10, "temperature": 0, "ignore_eos": True, "logprobs": 2}
    got = post(server, body)
    assert len(got["choices"]) == 4
    for choice in got["choices"]:
        want = oracle(plain, prompts[choice["index"] // 2], {"logprobs": 2}, max_tokens=10)
        assert choice["text"] == want.text
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(want.token_ids) == 10
        for got_lp, token, row in zip(lp["token_logprobs"], want.token_ids, want.logprobs):
            assert got_lp == pytest.approx(row[token], abs=1e-4)
    assert got["usage"]["completion_tokens"] == 40


def test_max_tokens_one_is_the_prompts_argmax(server, plain):
    """max_tokens 1 leaves no room for a draft: exactly the plain first token, usage 1."""
    want = oracle(plain, "aaaaaaaa", {}, max_tokens=1)
    got = post(server, {"prompt": "aaaaaaaa", "max_tokens": 1, "temperature": 0, "ignore_eos": True})
    assert got["choices"][0]["text"] == want.text and got["usage"]["completion_tokens"] == 1
    assert got["choices"][0]["finish_reason"] == "length"


def test_seeded_sampling_repeats_whole_and_streamed(server):
    """A seeded sampled request under speculation gives the same text every time and when streamed
    (the README's promise of seeded requests). Catches verification draws from a generator that is not
    the request's, or one shared between requests."""
    body = {"prompt": "aaaaaaaa", "max_tokens": 12, "temperature": 1.0, "seed": 5, "ignore_eos": True}
    first = post(server, body)["choices"][0]["text"]
    assert post(server, body)["choices"][0]["text"] == first
    assert "".join(c["choices"][0]["text"] for c in stream(server, body) if c.get("choices")) == first
