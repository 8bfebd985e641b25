"""Gaps in the speculative step and verifier: the draft length near max_tokens (metrics), the verifier's
zero-draft greedy row, and emission bookkeeping checked against a plain greedy run."""

from __future__ import annotations

import pytest
import torch

from nonstop.engine.sampling import SamplingParams
from nonstop.engine.speculative import SpeculativeConfig
from nonstop.engine.speculative.verify import verify
from nonstop.runtime.executors import ReferenceExecutor
from tests.speculative.helpers import ScriptedDrafter, generate, tiny_model

PROMPT = [[3, 4, 5, 6, 3, 4, 5, 6, 3, 4]]


def test_greedy_verify_without_drafts_takes_the_first_row():
    """verify() with no draft must emit the argmax of row 0 (the row after x) even when it is handed more
    rows (its contract: logits [>= k+1, V]); catches reading the last row instead."""
    logits = torch.full((3, 8), -1.0)
    logits[0, 5] = 2.0
    logits[1, 1] = 3.0
    logits[2, 6] = 4.0
    params = SamplingParams(max_tokens=4, temperature=0)
    assert verify([], None, logits, params, None) == [5]
    assert verify([5], None, logits, params, None) == [5, 1]


def test_no_draft_is_proposed_for_the_last_token_before_max_tokens():
    """With every draft right and max_tokens 7, k 4: the prefill emits 1 token, the first verify step 4 drafts
    + bonus (6 tokens), and the last token comes from a one-row step with no draft (the block may not run
    past max_tokens). Catches a draft length that ignores the bonus token (drafting one token too many:
    drafted/accepted counts 5, a wasted verify row)."""
    model = tiny_model("kimi_k3")
    params = SamplingParams(max_tokens=7, temperature=0, ignore_eos=True)
    want = generate(model, ReferenceExecutor(model), PROMPT, params)
    drafter = ScriptedDrafter({o.request_id: o.token_ids for o in want}, 99, model.cfg.vocab_size)
    got = generate(model, ReferenceExecutor(model), PROMPT, params, drafter, num_tokens=4)
    assert got[0].token_ids == want[0].token_ids and len(got[0].token_ids) == 7
    m = got[0].metrics
    assert (m["drafted_tokens"], m["accepted_tokens"], m["verify_steps"]) == (4, 4, 2)
    assert m["mean_accepted_length"] == 3.0


def test_a_low_temperature_request_is_still_sampled():
    """Any temperature > 0 samples (SamplingParams: only 0 is greedy): verification of a T = 0.3 request over
    a flat distribution must draw every token, not always the argmax. Catches treating low temperatures as
    greedy in the verifier."""
    params = SamplingParams(max_tokens=4, temperature=0.3)
    gen = torch.Generator().manual_seed(0)
    logits = torch.zeros(1, 4)
    seen = {verify([], None, logits, params, gen)[0] for _ in range(200)}
    assert seen == {0, 1, 2, 3}
    drafted = {tuple(verify([2], None, torch.zeros(2, 4), params, gen)) for _ in range(200)}
    assert {d[0] for d in drafted} == {0, 1, 2, 3}  # the draft 2 accepted w.p. 1/4, else one of 0, 1, 3


@pytest.mark.parametrize(
    "value,match",
    [
        ({1: 2}, r"unknown speculative option\(s\) 1; known: drafter, method"),
        ({"method": "ngram", 1: 2, "zz": 3}, r"unknown speculative option\(s\) 1, zz; known"),
    ],
)
def test_a_key_that_is_not_a_string_is_named_not_a_type_error(value, match):
    """A Python caller's non-string key was a bare TypeError from joining or sorting the unknown names
    ("sequence item 0: expected str instance", "'<' not supported between 'str' and 'int'")."""
    with pytest.raises(ValueError, match=match):
        SpeculativeConfig.parse(value)


@pytest.mark.parametrize("drafter", ["", "  "])
def test_an_empty_drafter_path_is_refused_not_read_as_the_default(drafter):
    """``drafter=''`` was falsy, so the model's own dspark/ directory was used without a word; an empty path
    names no directory and is refused."""
    with pytest.raises(ValueError, match="speculative drafter is an empty path"):
        SpeculativeConfig.parse({"method": "dspark", "drafter": drafter})
