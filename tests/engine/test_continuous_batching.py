"""EngineCore / EngineLoop: batch invariance, chunked prefill, cancellation, error isolation, overload."""

from __future__ import annotations

import threading

import pytest
import torch

from nonstop import LLM, SamplingParams
from nonstop.engine.loop import EngineLoop, EngineOverloaded, EngineStopped
from nonstop.runtime.interface import Executor
from tests.engine.tiny_models import synth_checkpoint

PROMPTS = [("the quick brown fox " * 2)[i % 5 : i % 5 + 3 + i] for i in range(16)]
GREEDY = SamplingParams(max_tokens=4, temperature=0, logprobs=0)


@pytest.fixture(scope="module")
def k3_dir(tmp_path_factory):
    return synth_checkpoint("k3", tmp_path_factory.mktemp("k3"))


def _tokens_and_logprobs(outputs):
    return [(o.token_ids, [row[t] for t, row in zip(o.token_ids, o.logprobs)]) for o in outputs]


def test_greedy_output_is_the_same_alone_and_in_a_batch(k3_dir):
    """Bit-identical tokens and logprobs for a prompt run alone, with 15 others, and with requests
    joining and leaving around it (5 slots for 16 prompts)."""
    together = LLM(k3_dir, max_batch=16, prefill_chunk=6, batch_invariant=True)
    alone = [_tokens_and_logprobs(together.generate([p], GREEDY))[0] for p in PROMPTS]
    assert _tokens_and_logprobs(together.generate(PROMPTS, GREEDY)) == alone
    churn = LLM(k3_dir, max_batch=5, prefill_chunk=6, batch_invariant=True)
    assert _tokens_and_logprobs(churn.generate(PROMPTS, GREEDY)) == alone


def test_chunked_prefill_matches_whole_prompt_prefill(k3_dir):
    params = SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=0, logprobs=0)
    prompt = "a prompt long enough for several chunks of three tokens"
    whole = LLM(k3_dir).generate([prompt], params)[0]
    chunked = LLM(k3_dir, prefill_chunk=3).generate([prompt], params)[0]
    assert len(chunked.prompt_logprobs) == len(whole.prompt_logprobs) == len(chunked.prompt_token_ids)
    for a, b in zip(whole.prompt_logprobs[1:], chunked.prompt_logprobs[1:]):
        assert a.keys() == b.keys()
        assert all(abs(a[k] - b[k]) < 1e-4 for k in a)
    assert abs(whole.logprobs[0][whole.token_ids[0]] - chunked.logprobs[0][chunked.token_ids[0]]) < 1e-4


def test_long_prompt_prefill_is_interleaved_with_decode(k3_dir):
    llm = LLM(k3_dir, max_batch=2, prefill_chunk=4, batch_invariant=True)
    core = llm.new_core(2)
    short = llm.make_request("hi", None, SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    long = llm.make_request("x" * 40, None, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    core.admit(short)
    core.step()  # short prefilled: first token
    core.admit(long)
    produced_while_long_prefills = 0
    while long.prefilled < len(long.prompt_ids):
        produced = [r for r, _ in core.step()]
        produced_while_long_prefills += short in produced
    assert produced_while_long_prefills >= 9  # one decode step per 4-token chunk


def _run_loop(loop, reqs, cancel_after=None):
    """Submit requests, collect their events until all finish; cancel the named ones after 1 event."""
    events = {r.request_id: [] for r in reqs}
    done = threading.Event()

    def sink_for(req):
        def sink(ev):
            events[req.request_id].append(ev)
            if cancel_after and req.request_id in cancel_after and len(events[req.request_id]) == 1:
                loop.cancel(req.request_id)
            if all(e and e[-1].finished for e in events.values()):
                done.set()

        return sink

    for r in reqs:
        loop.submit(r, sink_for(r))
    assert done.wait(60)
    return events


def test_cancel_frees_the_slot_and_others_continue(k3_dir):
    llm = LLM(k3_dir, max_batch=4, prefill_chunk=8, batch_invariant=True)
    loop = EngineLoop(llm.new_core(4, isolate_errors=True)).start()
    try:
        params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
        reqs = [llm.make_request(p, None, params, request_id=f"r{i}") for i, p in enumerate(PROMPTS[:6])]
        events = _run_loop(loop, reqs, cancel_after={"r1", "r4"})
        assert [events[f"r{i}"][-1].finish_reason for i in range(6)] == [
            "length",
            "abort",
            "length",
            "length",
            "abort",
            "length",
        ]
        assert sum(len(e.token_ids) for e in events["r0"]) == 30
        assert loop.num_active == 0 and len(loop.core.free_slots) == 4
    finally:
        loop.stop()


class FailOnToken(Executor):
    """An executor wrapper that raises whenever ``bad_token`` is among the input ids (declares the
    executor interface, as every backend does; the engine reads only that)."""

    def __init__(self, inner, bad_token: int):
        self.inner, self.bad_token = inner, bad_token
        self.name, self.stats = f"fail-on-{bad_token}", {}

    def forward(self, ids, cache, batch, last_only=False):
        if bool((ids == self.bad_token).any()):
            raise RuntimeError("injected failure")
        return self.inner.forward(ids, cache, batch, last_only)


def test_a_failing_request_errors_alone(k3_dir):
    llm = LLM(k3_dir, max_batch=4, prefill_chunk=8, batch_invariant=True)
    expected = llm.generate(PROMPTS[:3], GREEDY)
    core = llm.new_core(4, isolate_errors=True)
    core.executor = FailOnToken(core.executor, bad_token=ord("~"))
    loop = EngineLoop(core).start()
    try:
        reqs = [llm.make_request(p, None, GREEDY, request_id=f"r{i}") for i, p in enumerate(PROMPTS[:3])]
        reqs.insert(1, llm.make_request("boom~", None, GREEDY, request_id="bad"))
        events = _run_loop(loop, reqs)
        assert events["bad"][-1].finish_reason == "error" and "injected failure" in events["bad"][-1].error
        for i, out in enumerate(expected):
            assert [t for e in events[f"r{i}"] for t in e.token_ids] == out.token_ids
        assert loop.num_active == 0 and len(core.free_slots) == 4
    finally:
        loop.stop()


def test_full_waiting_queue_refuses_new_requests(k3_dir):
    """One free slot and two waiting places: the first request queued takes the slot at the next step boundary
    (it does not wait for one), the next two wait, the fourth is refused."""
    llm = LLM(k3_dir, max_batch=1)
    loop = EngineLoop(llm.new_core(1, isolate_errors=True), max_waiting=2).start()
    try:
        reqs = [llm.make_request("hello", None, GREEDY, request_id=f"r{i}") for i in range(4)]
        with loop._cond:  # hold the engine thread off the queue while we fill it
            for req in reqs[:3]:
                loop.submit(req, lambda ev: None)
            with pytest.raises(EngineOverloaded, match="2 requests are already waiting for a slot"):
                loop.submit(reqs[3], lambda ev: None)
    finally:
        loop.stop()


def test_prompt_longer_than_context_fails_cleanly(k3_dir):
    llm = LLM(k3_dir)
    core = llm.new_core(1, max_len=16)
    with pytest.raises(ValueError, match="context"):
        core.admit(llm.make_request("x" * 20, None, GREEDY))
    assert core.has_free_slot


def test_stop_ends_waiting_and_running_requests_with_an_error(k3_dir):
    llm = LLM(k3_dir, max_batch=1)
    loop = EngineLoop(llm.new_core(1, isolate_errors=True)).start()
    seen = []
    with loop._cond:
        for i in range(2):
            loop.submit(
                llm.make_request(
                    "hello", None, SamplingParams(max_tokens=200, temperature=0, ignore_eos=True), request_id=f"r{i}"
                ),
                seen.append,
            )
    loop.stop()
    finals = [e for e in seen if e.finished]
    assert len(finals) == 2 and all(e.finish_reason in ("error", "length") for e in finals)
    with pytest.raises(EngineStopped):
        loop.submit(llm.make_request("hello", None, GREEDY), seen.append)
    torch.testing.assert_close(torch.tensor(loop.num_active), torch.tensor(0))
