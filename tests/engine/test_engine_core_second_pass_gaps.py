"""Second-pass gaps in ``EngineCore``: prompt logprobs (which token each position scores, with and without
chunked prefill) against hand arithmetic on the scripted executor, whose next token after ``t`` is t + 1
with logit LEAD and every other logit 0."""

from __future__ import annotations

import math

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.engine.core import EngineCore
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import ByteTokenizer
from tests.engine.scripted_executor import LEAD, Scripted, V
from tests.engine.tiny_models import TINY_MODELS

LOG_Z = math.log(math.exp(LEAD) + (V - 1))  # log of the softmax denominator of every scripted row


def _run(prompt, prefill_chunk=None, **params):
    cfg = ModelConfig.from_file(TINY_MODELS["k3"])
    core = EngineCore(cfg, Scripted(), ByteTokenizer(V), 1, torch.float32, "cpu", None, prefill_chunk)
    params.setdefault("temperature", 0)
    req = Request("r", None, list(prompt), SamplingParams(**params), frozenset())
    core.admit(req)
    while core.active:
        core.step()
    return req


@pytest.mark.parametrize("chunk", [None, 2])
def test_prompt_logprobs_score_the_next_prompt_token(chunk):
    """prompt_logprobs[t] is the log-probability of prompt token t (given tokens before it), for t >= 1:
    the scripted row after token a gives a + 1 the logit LEAD, so 4 after 3 scores LEAD - log Z and the other
    tokens -log Z. Scoring token t - 1 instead (or the wrong row of a later chunk) changes the keys."""
    prompt = [3, 4, 9, 10, 20]
    req = _run(prompt, chunk, prompt_logprobs=0, max_tokens=1)
    got = req.prompt_logprobs
    assert got[0] is None
    assert [list(d) for d in got[1:]] == [[4], [9], [10], [20]]
    want = [LEAD - LOG_Z, -LOG_Z, LEAD - LOG_Z, -LOG_Z]
    assert [d[k] for d, k in zip(got[1:], prompt[1:])] == pytest.approx(want, abs=1e-5)
    assert req.output_ids == [21]


def test_output_logprobs_hold_sampled_and_top_tokens():
    """logprobs=1: each row holds the sampled token and the single most likely one, model logprobs (before
    temperature): greedy picks the lead, so the row is {lead: LEAD - log Z}."""
    req = _run([7], logprobs=1, max_tokens=3)
    assert req.output_ids == [8, 9, 10]
    assert [list(r) for r in req.logprobs] == [[8], [9], [10]]
    assert [r[t] for r, t in zip(req.logprobs, req.output_ids)] == pytest.approx([LEAD - LOG_Z] * 3, abs=1e-5)


def test_loop_streams_each_token_logprob_once():
    """Each ``StreamEvent`` carries the logprob rows of its own new tokens only: one row per token id in it, the
    rows of all events adding up to the request's (resending earlier rows would duplicate them in a stream)."""
    import threading

    from nonstop.engine.loop import EngineLoop

    cfg = ModelConfig.from_file(TINY_MODELS["k3"])
    core = EngineCore(cfg, Scripted(), ByteTokenizer(V), 1, torch.float32, "cpu")
    loop = EngineLoop(core).start()
    events, done = [], threading.Event()

    def sink(ev):
        events.append(ev)
        if ev.finished:
            done.set()

    try:
        req = Request("r", None, [7], SamplingParams(temperature=0, logprobs=0, max_tokens=4), frozenset())
        loop.submit(req, sink)
        assert done.wait(60)
    finally:
        loop.stop()
    assert all(len(ev.logprobs) == len(ev.token_ids) for ev in events)
    tokens = [t for ev in events for t in ev.token_ids]
    rows = [r for ev in events for r in ev.logprobs]
    assert tokens == [8, 9, 10, 11]
    assert [list(r) for r in rows] == [[8], [9], [10], [11]]


def test_batch_invariant_core_decodes_each_row_alone():
    """With ``batch_invariant`` on an executor that is not batch invariant itself, every decode forward holds one
    request, so a request's tokens do not depend on what else runs; without it the rows share one forward."""
    cfg = ModelConfig.from_file(TINY_MODELS["k3"])
    for invariant, want in ((True, [[[4]], [[11]]]), (False, [[[4], [11]]])):
        ex = Scripted()
        core = EngineCore(cfg, ex, ByteTokenizer(V), 2, torch.float32, "cpu", batch_invariant=invariant)
        for rid, prompt in (("a", [3]), ("b", [10])):
            core.add(Request(rid, None, prompt, SamplingParams(temperature=0, max_tokens=3), frozenset()))
        ex.calls.clear()
        core.step()
        assert ex.calls == want
