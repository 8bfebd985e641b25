"""The shipped k3-nano DSpark drafter must draft well inside the engine, not only correctly: its training report
(config.json) measured a mean accepted length of about 4.3 tokens per step at 4 drafts on held-out greedy
continuations. A drafting bug that keeps greedy output exact (verification rejects the bad drafts) but feeds the
drafter wrong positions, context features or Markov inputs shows up only as a collapse of the acceptance."""

from __future__ import annotations

from pathlib import Path

import pytest

from nonstop.engine.sampling import SamplingParams

ASSETS = Path(__file__).resolve().parents[2] / "nonstop" / "assets"


def _prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    paragraphs = [p for p in (ASSETS / "heldout_sample.txt").read_text().split("\n") if len(p) > 300]
    return [tokenizer.encode(p, add_special_tokens=False)[:length] for p in paragraphs[:n]]


@pytest.fixture(scope="module")
def dspark_run():
    from nonstop import LLM

    llm = LLM("k3-nano", max_batch=4, speculative={"method": "dspark", "num_tokens": 4})
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    return llm.generate(prompt_token_ids=_prompts(llm.tokenizer, 4, 32), sampling=params)


def test_shipped_drafter_accepts_most_drafts(dspark_run):
    """Tokens emitted per verification step (all requests together) stay near the training report's tau at 4
    drafts (~4.3; this run gets ~4.5 and 90% of drafts accepted on CPU fp32). Thresholds 3.8 / 0.75: block slot
    positions shifted by one give ~2.8 / 0.48, the anchor one position early ~3.5 / 0.67, taps read in the wrong
    order far less. Catches drafter position, tap-order and context bugs that keep greedy output exact."""
    steps = sum(o.metrics["verify_steps"] for o in dspark_run)
    emitted = sum(len(o.token_ids) - 1 for o in dspark_run)
    accepted = sum(o.metrics["accepted_tokens"] for o in dspark_run)
    drafted = sum(o.metrics["drafted_tokens"] for o in dspark_run)
    assert emitted / steps > 3.8, (emitted, steps)
    assert accepted / drafted > 0.75, (accepted, drafted)
