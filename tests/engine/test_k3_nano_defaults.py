"""k3-nano's shipped generation_config.json: its default sampling does not loop where greedy decoding
does (distinct 4-grams of completions of held-out prompts; the full measurement is
bench/k3_nano_sampling.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nonstop import LLM, SamplingParams
from nonstop.weights.resolve import ASSETS

HELDOUT = ASSETS / "heldout_sample.txt"
PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 6, 24, 64


def distinct4(ids: list[int]) -> float:
    grams = [tuple(ids[i : i + 4]) for i in range(len(ids) - 3)]
    return len(set(grams)) / len(grams)


@pytest.fixture(scope="module")
def nano():
    return LLM("k3-nano", dtype="float32", max_batch=PROMPTS)


def _prompts(llm) -> list[list[int]]:
    paragraphs = [p for p in Path(HELDOUT).read_text().split("\n") if len(p) > 300][-PROMPTS:]
    return [llm.tokenizer.encode(p, add_special_tokens=False)[:PROMPT_TOKENS] for p in paragraphs]


def test_default_sampling_does_not_loop_where_greedy_does(nano):
    defaults = nano.default_sampling()
    assert defaults.temperature > 0 and defaults.max_tokens >= NEW_TOKENS
    prompts = _prompts(nano)
    sampled = nano.generate(
        prompt_token_ids=prompts, sampling=nano.default_sampling(max_tokens=NEW_TOKENS, seed=5, ignore_eos=True)
    )
    greedy = nano.generate(
        prompt_token_ids=prompts, sampling=SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    )
    sampled_d4 = [distinct4(o.token_ids) for o in sampled if len(o.token_ids) > 8]
    greedy_d4 = [distinct4(o.token_ids) for o in greedy if len(o.token_ids) > 8]
    assert len(sampled_d4) >= PROMPTS // 2 and len(greedy_d4) >= PROMPTS // 2
    assert min(sampled_d4) > 0.7 and sum(sampled_d4) / len(sampled_d4) > 0.85, sampled_d4
    assert sum(greedy_d4) / len(greedy_d4) < 0.5, greedy_d4  # the check tells loops apart
