"""The LLM API: sampling parameters, logprobs, stop conditions, seeds, errors, tokenizers."""

from __future__ import annotations

import pytest
import torch

from nonstop import LLM, SamplingParams
from nonstop.config import ModelConfig
from nonstop.engine.tokenizer import ByteTokenizer, TokenizerError
from nonstop.model.sampling import filter_logits
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import KIMI_K3, LLAMA


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    path = write_checkpoint(
        ModelConfig.from_hf_dict(KIMI_K3), tmp_path_factory.mktemp("k3") / "m", seed=3, dtype=torch.float32
    )
    return LLM(path, dtype="float32")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"logprobs": -2}, "logprobs"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"seed": "x"}, "seed"),
    ],
)
def test_sampling_params_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = torch.isfinite(filter_logits(logits, 1.0, 2, 1.0))
    assert kept.tolist() == [True, True, False, False]
    kept = torch.isfinite(filter_logits(logits, 1.0, -1, 0.8))  # 0.5 + 0.3 reaches 0.8
    assert kept.tolist() == [True, True, False, False]
    kept = torch.isfinite(filter_logits(logits, 1.0, -1, 0.81))
    assert kept.tolist() == [True, True, True, False]


def test_logprobs_are_the_models_distribution(k3):
    prompt = [5, 9, 14, 200]
    out = k3.generate(
        prompt_token_ids=[prompt], sampling=SamplingParams(max_tokens=4, temperature=0.7, top_k=3, seed=1, logprobs=2)
    )[0]
    ids = torch.tensor([prompt + out.token_ids])
    full = torch.log_softmax(k3.model(ids)[0], -1)
    for i, (tok, row) in enumerate(zip(out.token_ids, out.logprobs)):
        pos = len(prompt) - 1 + i
        assert tok in row and len(row) in (2, 3)
        for t, lp in row.items():
            assert lp == pytest.approx(float(full[pos, t]), abs=1e-5)
        top2 = torch.topk(full[pos], 2).indices.tolist()
        assert set(top2) <= set(row)


def test_seeded_sampling_is_reproducible(k3):
    p = SamplingParams(max_tokens=10, temperature=1.0, seed=42)
    a = k3.generate(prompt_token_ids=[[3, 4, 5]], sampling=p)[0].token_ids
    b = k3.generate(prompt_token_ids=[[3, 4, 5]], sampling=p)[0].token_ids
    c = k3.generate(prompt_token_ids=[[3, 4, 5]], sampling=SamplingParams(max_tokens=10, temperature=1.0, seed=43))[
        0
    ].token_ids
    assert a == b and a != c


def test_stop_conditions(k3):
    greedy = k3.generate(
        prompt_token_ids=[[7, 8, 9]], sampling=SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    )[0]
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 12
    stop_tok = greedy.token_ids[4]
    first = greedy.token_ids.index(stop_tok)
    out = k3.generate(
        prompt_token_ids=[[7, 8, 9]], sampling=SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[stop_tok])
    )[0]
    assert out.finish_reason == "stop" and out.token_ids == greedy.token_ids[: first + 1]
    text = k3.generate(
        prompt_token_ids=[[7, 8, 9]], sampling=SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    )[0].text
    stop = text[3:5]
    if stop:
        cut = k3.generate(
            prompt_token_ids=[[7, 8, 9]],
            sampling=SamplingParams(max_tokens=12, temperature=0, stop=stop, ignore_eos=True),
        )[0]
        assert cut.finish_reason == "stop" and cut.text == text[: text.find(stop)]


def test_request_errors(k3):
    with pytest.raises(ValueError, match="empty prompt"):
        k3.generate(prompt_token_ids=[[]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        k3.generate(prompt_token_ids=[[1, 10_000]])
    with pytest.raises(ValueError, match="exceeds the model's context"):
        k3.generate(prompt_token_ids=[[1, 2]], sampling=SamplingParams(max_tokens=10**7))
    with pytest.raises(ValueError, match="exactly one of"):
        k3.generate()
    with pytest.raises(ValueError, match="unknown backend"):
        LLM(k3.model_dir, backend="warp")


def test_text_prompts_use_the_checkpoint_tokenizer(k3):
    out = k3.generate(["héllo"], sampling=SamplingParams(max_tokens=3, temperature=0))[0]
    assert out.prompt_token_ids == list("héllo".encode())  # synth wrote a byte-level tokenizer.json


def test_byte_tokenizer_fallback():
    tok = ByteTokenizer(300)
    assert tok.decode(tok.encode("a ☃ b")) == "a ☃ b"
    assert tok.decode([104, 105, 260]) == "hi<|260|>"
    with pytest.raises(TokenizerError, match="pass token ids"):
        ByteTokenizer(100).encode("~é")


def test_llama_tied_embeddings_generate(tmp_path):
    path = write_checkpoint(ModelConfig.from_hf_dict(LLAMA), tmp_path / "ll", dtype=torch.float32)
    out = LLM(path).generate(
        prompt_token_ids=[[1, 2, 3]], sampling=SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    )[0]
    assert len(out.token_ids) == 5 and out.metrics["generated_tokens"] == 5
