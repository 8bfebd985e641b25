"""Sampled DSpark drafting must draw from the request's own generator: a seeded sampled request under the DSpark
drafter gives the same tokens whatever torch's global RNG holds, and leaves the caller's global RNG alone."""

from __future__ import annotations

import pytest
import torch

from nonstop.engine.sampling import SamplingParams
from nonstop.engine.speculative.dspark import DSparkConfig, DSparkModel
from nonstop.engine.speculative.dspark_drafter import DSparkDrafter
from nonstop.runtime.executors import ReferenceExecutor
from tests.speculative.helpers import generate, tiny_model

PROMPTS = [[3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [9, 8, 9, 8, 9, 8, 9]]


def _drafter(model) -> DSparkDrafter:
    torch.manual_seed(0)
    cfg = DSparkConfig(
        model.cfg.vocab_size,
        model.cfg.hidden_size,
        taps=(3,),
        block_size=4,
        num_heads=2,
        head_dim=8,
        intermediate_size=32,
        context_window=8,
        markov_rank=4,
    )
    return DSparkDrafter(DSparkModel(cfg).eval(), model)


def _run(params, global_seed: int):
    model = tiny_model("llama")
    drafter = _drafter(model)
    torch.manual_seed(global_seed)
    return generate(model, ReferenceExecutor(model), PROMPTS, params, drafter, num_tokens=4)


def test_seeded_sampled_dspark_run_ignores_the_global_rng():
    """Two runs of the same seeded, sampled requests with different global RNG states give the same tokens, and
    a run does not advance the global RNG. Catches DSpark draft sampling that uses torch's global generator
    instead of the request's (seeded requests would not be reproducible)."""
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=3, ignore_eos=True)
    a = _run(params, 0)
    b = _run(params, 1)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert sum(o.metrics["drafted_tokens"] for o in a) > 0
    model = tiny_model("llama")
    drafter = _drafter(model)
    torch.manual_seed(11)
    before = torch.random.get_rng_state()
    generate(model, ReferenceExecutor(model), PROMPTS, params, drafter, num_tokens=4)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_a_drafter_of_another_hidden_size_is_refused_at_load():
    """A drafter trained for another hidden size (same vocabulary) is refused when it is built, with a message
    naming both sizes, instead of a shape error inside the first prefill. Catches a dropped hidden-size check."""
    target = tiny_model("llama")
    d = target.cfg.hidden_size
    cfg = DSparkConfig(target.cfg.vocab_size, d * 2, taps=(1,), num_heads=2, head_dim=8, intermediate_size=16)
    with pytest.raises(ValueError, match=f"hidden {2 * d}.*hidden {d}"):
        DSparkDrafter(DSparkModel(cfg), target)


def test_a_drafter_with_no_observed_context_drafts_nothing():
    """propose() on a request whose prompt the target has not yet run (no context features) returns an empty
    draft instead of failing on the empty context. Catches a dropped no-context guard."""
    from nonstop.engine.requests import Request

    model = tiny_model("llama")
    drafter = _drafter(model)
    req = Request("r", None, [3, 4, 5], SamplingParams(max_tokens=4, temperature=0), frozenset())
    req.output_ids.append(6)
    drafter.start(req)
    assert drafter.propose(req, 3).tokens == []
