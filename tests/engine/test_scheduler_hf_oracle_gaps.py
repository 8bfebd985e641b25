"""EngineCore / EngineLoop scheduling checked against an independent oracle: a plain greedy loop over the
transformers model of the same checkpoint.

The checkpoint is a tiny untied Llama written by transformers itself with wide random weights, so each
prompt's greedy continuation varies token to token (a tiny tied model only repeats its last prompt token,
which would hide a request reading another's row or a stale cache). The engine runs on the ``reference``
backend without batch invariance: requests share forwards, so one request's output may only match the
oracle if its row, its slot and its cache length are its own.
"""

from __future__ import annotations

import threading

import pytest
import torch

from nonstop import LLM, SamplingParams
from nonstop.engine.loop import EngineLoop
from tests.engine.hf_llama import untied_llama

VOCAB = 96
PROMPTS = [[5, 17, 33], [40, 3, 9, 71, 12, 8, 66], [90], [11, 11, 50, 7, 81]]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """(transformers model, checkpoint dir) of a tiny untied Llama of 96 ids."""
    return untied_llama(tmp_path_factory.mktemp("hf"), VOCAB)


_CACHE: dict[tuple[int, ...], list[int]] = {}


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """The oracle: n greedy tokens after ``prompt`` by full forwards of the transformers model."""
    key = tuple(prompt)
    have = _CACHE.get(key, [])
    if len(have) < n:
        ids = list(prompt) + have
        with torch.no_grad():
            while len(ids) - len(prompt) < n:
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        _CACHE[key] = ids[len(prompt) :]
    return _CACHE[key][:n]


def _llm(path, **kw) -> LLM:
    return LLM(path, backend="reference", tokenizer="bytes", **kw)


def _params(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, **kw)


def _drain(core) -> None:
    while core.active:
        core.step()


def test_batched_requests_with_slot_churn_match_the_oracle(hf):
    """Four prompts of different lengths through two slots, three-token prefill chunks, rows sharing forwards:
    catches a request reading another row's logits, a slot reused without its cache reset, prefill chunks
    lost or repeated, and cache lengths not advanced."""
    model, path = hf
    outs = _llm(path, max_batch=2, prefill_chunk=3).generate(prompt_token_ids=PROMPTS, sampling=_params(6))
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == greedy(model, prompt, 6)
        assert out.finish_reason == "length"


def test_each_request_gets_exactly_its_own_max_tokens(hf):
    """Requests with max_tokens 1, 2 and 5 decoding together: each ends with finish_reason ``length`` after
    exactly its own count (an off-by-one in the length check, or a finished request left in the batch)."""
    model, path = hf
    llm = _llm(path)
    core = llm.new_core(3)
    reqs = [llm.make_request(None, p, _params(n)) for p, n in zip(PROMPTS, (1, 2, 5))]
    for r in reqs:
        core.admit(r)
    _drain(core)
    for r, n in zip(reqs, (1, 2, 5)):
        assert r.output_ids == greedy(model, r.prompt_ids, n)
        assert r.finish_reason == "length"
    assert sorted(core.free_slots) == [0, 1, 2] and not core.active


def test_a_stop_token_ends_the_request_where_the_oracle_emits_it(hf):
    """A stop token id equal to the oracle's third token ends the request with ``stop`` after three tokens
    while the request batched with it runs on to its length."""
    model, path = hf
    llm = _llm(path)
    core = llm.new_core(2)
    third = greedy(model, PROMPTS[1], 3)[2]
    assert third not in greedy(model, PROMPTS[1], 2)
    stopped = llm.make_request(None, PROMPTS[1], _params(8, stop_token_ids=[third]))
    other = llm.make_request(None, PROMPTS[0], _params(5))
    core.admit(stopped)
    core.admit(other)
    _drain(core)
    assert stopped.output_ids == greedy(model, PROMPTS[1], 3)
    assert stopped.finish_reason == "stop"
    assert other.output_ids == greedy(model, PROMPTS[0], 5) and other.finish_reason == "length"


def test_a_request_admitted_into_a_freed_slot_mid_decode_matches_the_oracle(hf):
    """A request joins while another decodes, in the slot a finished request just left: catches a slot not
    freed, or freed without its cache being reset (the newcomer would attend to the old sequence)."""
    model, path = hf
    llm = _llm(path, prefill_chunk=2)
    core = llm.new_core(2)
    long = llm.make_request(None, PROMPTS[1], _params(8))
    short = llm.make_request(None, PROMPTS[3], _params(1))
    core.admit(long)
    core.admit(short)
    while not short.finished:
        core.step()
    assert core.has_free_slot and len(core.free_slots) == 1
    late = llm.make_request(None, PROMPTS[0], _params(4))
    core.admit(late)
    _drain(core)
    assert short.output_ids == greedy(model, PROMPTS[3], 1)
    assert long.output_ids == greedy(model, PROMPTS[1], 8)
    assert late.output_ids == greedy(model, PROMPTS[0], 4)
    assert sorted(core.free_slots) == [0, 1]


def test_aborting_a_request_mid_prefill_frees_its_slot_and_leaves_the_others_intact(hf):
    """A request aborted while its prompt is half prefilled leaves ``prefilling``, frees its slot and ends with
    ``abort``; a new request in that slot, and one decoding beside it, still match the oracle."""
    model, path = hf
    llm = _llm(path, prefill_chunk=2)
    core = llm.new_core(2)
    running = llm.make_request(None, PROMPTS[0], _params(6))
    core.admit(running)
    core.step()  # first chunk
    core.step()  # second chunk: first token
    half = llm.make_request(None, PROMPTS[1], _params(6))
    core.admit(half)
    core.step()
    assert 0 < half.prefilled < len(half.prompt_ids)
    core.abort(half)
    assert half.finish_reason == "abort" and half.slot == -1
    assert half not in core.active and len(core.free_slots) == 1
    fresh = llm.make_request(None, PROMPTS[3], _params(3))
    core.admit(fresh)
    _drain(core)
    assert running.output_ids == greedy(model, PROMPTS[0], 6)
    assert fresh.output_ids == greedy(model, PROMPTS[3], 3)
    assert sorted(core.free_slots) == [0, 1]


def test_aborting_a_decoding_request_frees_its_slot(hf):
    """A request aborted while it decodes ends with ``abort`` keeping the tokens it had, frees its slot once,
    and the request beside it still matches the oracle."""
    model, path = hf
    llm = _llm(path)
    core = llm.new_core(2)
    a = llm.make_request(None, PROMPTS[2], _params(10))
    b = llm.make_request(None, PROMPTS[3], _params(5))
    core.admit(a)
    core.admit(b)
    core.step()
    core.step()
    core.abort(a)
    core.abort(a)  # a second abort must not free the slot twice
    assert a.finish_reason == "abort" and a.output_ids == greedy(model, PROMPTS[2], 2)
    assert len(core.free_slots) == 1
    _drain(core)
    assert b.output_ids == greedy(model, PROMPTS[3], 5)
    assert sorted(core.free_slots) == [0, 1]


def test_engine_loop_streams_match_the_oracle_and_free_every_slot(hf):
    """Five requests through an EngineLoop of two slots, one cancelled after its first event: the others'
    streamed tokens concatenate to the oracle's, every stream ends once with the right reason, and no slot
    is left held."""
    model, path = hf
    llm = _llm(path, prefill_chunk=3)
    loop = EngineLoop(llm.new_core(2, isolate_errors=True)).start()
    prompts = PROMPTS + [[7, 8, 9, 10]]
    events: dict[str, list] = {f"r{i}": [] for i in range(len(prompts))}
    done = threading.Event()

    def sink_for(rid):
        def sink(ev):
            events[rid].append(ev)
            if rid == "r1" and len(events[rid]) == 1:
                loop.cancel(rid)
            if all(e and e[-1].finished for e in events.values()):
                done.set()

        return sink

    try:
        for i, p in enumerate(prompts):
            loop.submit(llm.make_request(None, p, _params(5), request_id=f"r{i}"), sink_for(f"r{i}"))
        assert done.wait(60)
        for rid, evs in events.items():
            assert [e.finished for e in evs].count(True) == 1 and evs[-1].finished
            tokens = [t for e in evs for t in e.token_ids]
            i = int(rid[1:])
            if rid == "r1":
                assert evs[-1].finish_reason == "abort"
                assert tokens == greedy(model, prompts[i], len(tokens)) and len(tokens) < 5
            else:
                assert evs[-1].finish_reason == "length"
                assert tokens == greedy(model, prompts[i], 5)
        assert loop.num_active == 0 and sorted(loop.core.free_slots) == [0, 1]
    finally:
        loop.stop()
