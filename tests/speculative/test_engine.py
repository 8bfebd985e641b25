"""The speculative engine step: greedy outputs identical to plain decoding (every family, scripted
drafts that are all right, all wrong, partly right or empty, n-gram and DSpark drafters, stop
conditions and max_tokens inside a block, logprobs, batched rows, the superop program), metrics,
and the LLM / SpeculativeConfig surface."""

from __future__ import annotations

import pytest
import torch

from nonstop.engine.sampling import SamplingParams
from nonstop.engine.speculative import SpeculativeConfig
from nonstop.engine.speculative.dspark import DSparkConfig, DSparkModel
from nonstop.engine.speculative.dspark_drafter import DSparkDrafter
from nonstop.engine.speculative.ngram import NgramDrafter, lookup
from nonstop.runtime.executors import ReferenceExecutor
from nonstop.runtime.superop import SuperOpExecutor
from tests.speculative.helpers import EmptyDrafter, ScriptedDrafter, generate, tiny_model

GREEDY = SamplingParams(max_tokens=14, temperature=0, ignore_eos=True)
REPEATING = [[3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [9, 8, 9, 8, 9, 8, 9], [1, 2, 3, 1, 2]]


def plain(model, prompts, params=GREEDY, executor=None):
    return generate(model, executor or ReferenceExecutor(model), prompts, params)


@pytest.mark.parametrize("right", [0, 2, 99])
@pytest.mark.parametrize("name", ["kimi_k3", "llama"])
def test_scripted_drafts_keep_plain_greedy_tokens(name, right):
    model = tiny_model(name)
    want = plain(model, REPEATING)
    drafter = ScriptedDrafter({o.request_id: o.token_ids for o in want}, right, model.cfg.vocab_size)
    got = generate(model, ReferenceExecutor(model), REPEATING, GREEDY, drafter, num_tokens=4)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for o in got:
        m = o.metrics
        steps, n = m["verify_steps"], len(o.token_ids)
        assert m["mean_accepted_length"] == pytest.approx((n - 1) / steps)
        if right == 0:
            assert m["accepted_tokens"] == 0 and steps == n - 1
        if right == 99:  # every draft accepted: k+1 tokens per step until max_tokens
            assert m["accepted_tokens"] == n - 1 - steps and steps == -(-(n - 1) // 5)


def test_zero_drafts_keep_plain_greedy_tokens():
    model = tiny_model("kimi_k3")
    want = plain(model, REPEATING)
    got = generate(model, ReferenceExecutor(model), REPEATING, GREEDY, EmptyDrafter())
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert all(o.metrics["drafted_tokens"] == 0 and o.metrics["mean_accepted_length"] == 1 for o in got)


@pytest.mark.parametrize(
    "name", ["kimi_k3", "kimi_linear", "kimi_linear_layer_types", "deepseek_v3", "llama", "kimi_k3_mxfp4"]
)
def test_ngram_greedy_equals_plain_every_family(name):
    model = tiny_model(name)
    want = plain(model, REPEATING)
    got = generate(model, ReferenceExecutor(model), REPEATING, GREEDY, NgramDrafter(3, 1), num_tokens=3)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert sum(o.metrics["drafted_tokens"] for o in got) > 0


def random_dspark(model, taps, block=4):
    torch.manual_seed(0)
    return DSparkDrafter(
        DSparkModel(
            DSparkConfig(
                model.cfg.vocab_size,
                model.cfg.hidden_size,
                taps=taps,
                block_size=block,
                num_heads=2,
                head_dim=8,
                intermediate_size=32,
                context_window=8,
                markov_rank=4,
            )
        ).eval(),
        model,
    )


@pytest.mark.parametrize("name,taps", [("kimi_k3", (3, 6, 7)), ("llama", (3,)), ("kimi_linear", (2, 5))])
def test_dspark_greedy_equals_plain(name, taps):
    model = tiny_model(name)
    want = plain(model, REPEATING)
    got = generate(model, ReferenceExecutor(model), REPEATING, GREEDY, random_dspark(model, taps), num_tokens=4)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert all(o.metrics["drafted_tokens"] > 0 for o in got)


def test_stop_and_length_inside_a_block():
    """A stop token or max_tokens in the middle of an accepted block ends the request exactly where
    plain decoding ends it."""
    model = tiny_model("kimi_k3")
    free = plain(model, REPEATING)
    stops = [o.token_ids[5] for o in free]
    params = [SamplingParams(max_tokens=14, temperature=0, ignore_eos=True, stop_token_ids=[s]) for s in stops]
    params[2] = SamplingParams(max_tokens=7, temperature=0, ignore_eos=True)
    want = plain(model, REPEATING, params)
    drafter = ScriptedDrafter({o.request_id: o.token_ids for o in free}, 99, model.cfg.vocab_size)
    got = generate(model, ReferenceExecutor(model), REPEATING, params, drafter, num_tokens=4)
    for g, w in zip(got, want):
        assert (g.token_ids, g.finish_reason, g.text) == (w.token_ids, w.finish_reason, w.text)


def test_logprobs_match_plain():
    model = tiny_model("kimi_k3")
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=3)
    want = plain(model, REPEATING, params)
    drafter = ScriptedDrafter({o.request_id: o.token_ids for o in want}, 2, model.cfg.vocab_size)
    got = generate(model, ReferenceExecutor(model), REPEATING, params, drafter)
    for g, w in zip(got, want):
        assert len(g.logprobs) == len(w.logprobs)
        for a, b in zip(g.logprobs, w.logprobs):
            assert a.keys() == b.keys()
            assert all(a[k] == pytest.approx(b[k], abs=1e-5) for k in a)


def test_batched_rows_equal_one_request_at_a_time():
    """Without batch invariance the verification rows of all requests share one forward (padded to
    the longest draft); each row is still computed as alone."""
    model = tiny_model("k3-nano")
    prompts = [[5, 6, 7, 5, 6, 7, 5], [100, 200, 100, 200, 100], [42, 43, 44]]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    want = plain(model, prompts, params)
    got = generate(
        model, ReferenceExecutor(model), prompts, params, NgramDrafter(3, 1), num_tokens=3, batch_invariant=False
    )
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_superop_program_verification_equals_plain_superop():
    model = tiny_model("kimi_k3")
    ex = SuperOpExecutor(model, use_kernels=False)
    want = plain(model, REPEATING, executor=ex)
    steps_before = ex.stats["program_steps"]
    got = generate(model, ex, REPEATING, GREEDY, NgramDrafter(3, 1), num_tokens=3, batch_invariant=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert ex.stats["program_steps"] > steps_before  # the verification rows went through the program


def test_ngram_lookup():
    assert lookup([1, 2, 3, 9, 1, 2, 3], 3, 3, 1) == [9, 1, 2]
    assert lookup([1, 2, 3, 4], 3, 3, 1) == []
    assert lookup([5, 1, 7, 2, 1], 2, 3, 1) == [7, 2]  # n = 1: the latest earlier 1
    assert lookup([7, 7, 7], 4, 3, 2) == [7]  # what follows the match, up to the end
    assert lookup([1, 2], 0, 3, 1) == []


def test_spec_config_parsing():
    assert SpeculativeConfig.parse({"method": "ngram", "num_tokens": 3}).num_tokens == 3
    for bad in (
        {"method": "eagle"},
        {"method": "ngram", "num_tokens": 16},
        {"num_tokens": 2},
        {"method": "ngram", "k": 2},
    ):
        with pytest.raises(ValueError):
            SpeculativeConfig.parse(bad)
    with pytest.raises(TypeError):
        SpeculativeConfig.parse("ngram")


def test_dspark_through_the_superop_program():
    """The program keeps the AttnRes block sums and the last residual: a drafter tapping them runs
    with verification through the program, and greedy tokens equal plain superop decoding."""
    model = tiny_model("kimi_k3")  # 7 layers, AttnRes blocks of 3: taps 3, 6 and 7 (the last residual)
    ex = SuperOpExecutor(model, use_kernels=False)
    want = plain(model, REPEATING, executor=ex)
    before = ex.stats["program_steps"]
    got = generate(model, ex, REPEATING, GREEDY, random_dspark(model, (3, 6, 7)), num_tokens=3)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert ex.stats["program_steps"] > before


def test_program_taps_equal_the_model_capture():
    from nonstop.cache.state import ModelCache

    model = tiny_model("kimi_k3")
    ex = SuperOpExecutor(model, use_kernels=False)
    ids = torch.tensor([[5, 9, 2], [7, 1, 4]])
    caches = [ModelCache(model.cfg, 2, capacity=8) for _ in range(2)]
    with torch.inference_mode():
        want = ReferenceExecutor(model).forward_hidden(ids, caches[0], caches[0].batch([0, 1], 3), (0, 3, 6, 7))[1]
        got = ex.forward_hidden(ids, caches[1], caches[1].batch([0, 1], 3), (0, 3, 6, 7))[1]
        with pytest.raises(ValueError, match="keeps the residual stream"):
            ex.forward_hidden(ids, caches[1], caches[1].batch([0, 1], 3), (2,))
    for tap in want:
        torch.testing.assert_close(got[tap], want[tap], rtol=1e-5, atol=1e-5)
