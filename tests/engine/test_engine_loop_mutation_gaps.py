"""EngineCore / EngineLoop scheduling and returned values that a mutation audit of the request loop found
untested: context bounds, prefill budgets, slots, finish reasons, token counts and logprobs.

The engine runs here over a scripted executor (no model): every row's next token is ``(last + 1) % V`` with
logit ``LEAD`` and every other token logit 0, so tokens, texts and logprobs follow by hand arithmetic.
"""

from __future__ import annotations

import json
import math
import threading

import pytest
import torch

from nonstop import LLM
from nonstop.config import ModelConfig
from nonstop.engine.core import EngineCore, check_fits
from nonstop.engine.loop import EngineLoop, EngineStopped
from nonstop.engine.requests import Request
from nonstop.engine.sampling import InvalidSamplingParam, SamplingParams, sample
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.engine.warmup import warm_up
from tests.engine.scripted_executor import LEAD, Scripted, V
from tests.engine.tiny_models import TINY_MODELS, synth_checkpoint

LOGPROB_NEXT = LEAD - math.log(math.exp(LEAD) + V - 1)  # log softmax of the leading token
LOGPROB_OTHER = -math.log(math.exp(LEAD) + V - 1)


def _core(num_slots=2, prefill_chunk=None, max_len=None, **kw) -> EngineCore:
    cfg = ModelConfig.from_file(TINY_MODELS["k3"])
    return EngineCore(cfg, Scripted(), ByteTokenizer(V), num_slots, torch.float32, "cpu", max_len, prefill_chunk, **kw)


def _req(prompt: str | list[int], rid="r", eos=(), **params) -> Request:
    ids = list(prompt.encode()) if isinstance(prompt, str) else list(prompt)
    params.setdefault("temperature", 0)
    return Request(rid, None, ids, SamplingParams(**params), frozenset(eos))


def _drain(core: EngineCore) -> None:
    while core.active:
        core.step()


# ------------------------------------------------------------------ admission


def test_prompt_plus_max_tokens_may_equal_the_context():
    check_fits(10, 6, 16)  # 16 positions hold the prompt and every generated token
    with pytest.raises(ValueError, match="exceeds the model's context of 16"):
        check_fits(10, 7, 16)
    core = _core(max_len=8)
    core.admit(_req("abcde", max_tokens=3))  # 5 + 3 = 8
    with pytest.raises(ValueError, match="context"):
        core.admit(_req("abcde", rid="s", max_tokens=4))


def test_an_empty_prompt_is_refused_by_the_core_and_keeps_its_slot():
    core = _core(num_slots=1)
    with pytest.raises(ValueError, match="empty prompt"):
        core.admit(_req([], max_tokens=2))
    assert core.has_free_slot and not core.active


# ------------------------------------------------------------------ chunked prefill scheduling


def _first_token_steps(core: EngineCore, reqs: list[Request]) -> dict[str, int]:
    """The step (1-based) at which each request got its first token."""
    first, step = {}, 0
    while core.active:
        step += 1
        core.step()
        for r in reqs:
            if r.output_ids and r.request_id not in first:
                first[r.request_id] = step
    return first


def test_short_prompts_share_one_steps_prefill_budget():
    core = _core(num_slots=3, prefill_chunk=4)
    reqs = [_req("ab", rid=f"r{i}", max_tokens=1) for i in range(3)]
    for r in reqs:
        core.admit(r)
    # 2 + 2 tokens fill the budget of 4; the third prompt waits for the next step
    assert _first_token_steps(core, reqs) == {"r0": 1, "r1": 1, "r2": 2}


def test_prompts_are_prefilled_oldest_first():
    core = _core(num_slots=3, prefill_chunk=4)
    reqs = [
        _req("abcdef", rid="a", max_tokens=1),
        _req("abcd", rid="b", max_tokens=1),
        _req("a", rid="c", max_tokens=1),
    ]
    for r in reqs:
        core.admit(r)
    # step 1: a[0:4]; step 2: a[4:6] (b's 4 do not fit beside it); step 3: b; step 4: c
    assert _first_token_steps(core, reqs) == {"a": 2, "b": 3, "c": 4}


# ------------------------------------------------------------------ logprobs


def test_prompt_logprobs_score_the_next_prompt_token():
    core = _core(prefill_chunk=2)
    req = _req("abcdx", max_tokens=1, prompt_logprobs=0)
    core.admit(req)
    _drain(core)
    # position t predicts t + 1: 'b' 'c' 'd' are the scripted next tokens, 'x' after 'd' is not
    assert req.prompt_logprobs[0] is None
    assert [list(row) for row in req.prompt_logprobs[1:]] == [[ord("b")], [ord("c")], [ord("d")], [ord("x")]]
    got = [v for row in req.prompt_logprobs[1:] for v in row.values()]
    assert got == pytest.approx([LOGPROB_NEXT] * 3 + [LOGPROB_OTHER])


def test_logprobs_hold_the_sampled_token_not_the_most_likely_one():
    core = _core()
    req = _req("a", max_tokens=8, temperature=50.0, seed=7, logprobs=0)
    core.admit(req)
    _drain(core)
    assert len(req.logprobs) == len(req.output_ids) == 8
    previous = [ord("a"), *req.output_ids[:-1]]
    want = [{t: LOGPROB_NEXT if t == (p + 1) % V else LOGPROB_OTHER} for p, t in zip(previous, req.output_ids)]
    assert [list(row) for row in req.logprobs] == [list(row) for row in want]
    assert [v for row in req.logprobs for v in row.values()] == pytest.approx([v for row in want for v in row.values()])
    assert any(t != (p + 1) % V for p, t in zip(previous, req.output_ids))  # some token was not the argmax


# ------------------------------------------------------------------ the engine loop


class _Collector:
    """Sinks that record every request's events; ``wait`` until all have finished."""

    def __init__(self, ids):
        self.events = {i: [] for i in ids}
        self.done = threading.Event()

    def sink(self, ev):
        self.events[ev.request.request_id].append(ev)
        if all(e and e[-1].finished for e in self.events.values()):
            self.done.set()

    def wait(self):
        assert self.done.wait(20), {k: [e.finish_reason for e in v] for k, v in self.events.items()}
        return self.events


def test_cancelling_a_waiting_request_ends_it_before_it_runs():
    loop = EngineLoop(_core(num_slots=1, isolate_errors=True)).start()
    try:
        running = _req("a", rid="running", max_tokens=20)
        waiting = _req("a", rid="waiting", max_tokens=20)
        got = _Collector(["running", "waiting"])
        with loop._cond:  # both queued before the engine thread looks: one slot, so "waiting" waits
            loop.submit(running, got.sink)
            loop.submit(waiting, got.sink)
            loop.cancel("waiting")
        events = got.wait()
        assert [(e.finish_reason, e.token_ids) for e in events["waiting"]] == [("abort", [])]
        assert waiting.finish_reason == "abort" and waiting.output_ids == []
        assert events["running"][-1].finish_reason == "length"
        assert sum(len(e.token_ids) for e in events["running"]) == 20
    finally:
        loop.stop()


# ------------------------------------------------------------------ errors


class _FailOn(Scripted):
    """Raises whenever ``bad`` is among the input ids."""

    def __init__(self, bad: int):
        super().__init__()
        self.bad = bad

    def forward(self, ids, cache, batch, last_only=False):
        if bool((ids == self.bad).any()):
            raise RuntimeError("injected failure")
        return super().forward(ids, cache, batch, last_only)


def test_a_failing_forward_propagates_without_isolate_errors():
    core = _core(num_slots=2)
    core.executor = _FailOn(ord("~"))
    core.admit(_req("ok", rid="ok", max_tokens=3))
    core.admit(_req("~", rid="bad", max_tokens=3))
    with pytest.raises(RuntimeError, match="injected failure"):
        _drain(core)


def test_a_failing_forward_ends_only_its_request_with_isolate_errors():
    core = _core(num_slots=2, isolate_errors=True)
    core.executor = _FailOn(ord("~"))
    ok, bad = _req("ok", rid="ok", max_tokens=3), _req("~", rid="bad", max_tokens=3)
    core.admit(ok)
    core.admit(bad)
    _drain(core)
    assert (bad.finish_reason, bad.output_ids) == ("error", [])
    assert bad.error == "RuntimeError: injected failure"
    assert (ok.finish_reason, ok.output_ids) == ("length", [ord("l"), ord("m"), ord("n")])
    assert sorted(core.free_slots) == [0, 1]


@pytest.mark.parametrize("chunk", [0, -1])
def test_a_prefill_chunk_below_one_is_refused(chunk):
    with pytest.raises(ValueError, match="prefill_chunk must be >= 1"):
        _core(prefill_chunk=chunk)


def test_a_request_whose_sink_fails_is_aborted_and_frees_its_slot():
    loop = EngineLoop(_core(num_slots=1, isolate_errors=True)).start()
    try:
        gone = _req("a", rid="gone", max_tokens=400)

        def broken(ev):
            raise ConnectionError("client gone")

        loop.submit(gone, broken)
        after = _req("a", rid="after", max_tokens=2)
        got = _Collector(["after"])
        loop.submit(after, got.sink)
        got.wait()
        assert gone.finish_reason == "abort" and len(gone.output_ids) < 400  # not run to its max_tokens
        assert loop.num_active == 0 and len(loop.core.free_slots) == 1
    finally:
        loop.stop()


class _Blocking(Scripted):
    """Blocks every forward until ``release`` is set; ``entered`` is set once a forward has begun."""

    def __init__(self):
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def forward(self, ids, cache, batch, last_only=False):
        self.entered.set()
        assert self.release.wait(20)
        return super().forward(ids, cache, batch, last_only)


def test_a_loop_that_is_stopping_refuses_new_requests():
    core = _core(num_slots=1, isolate_errors=True)
    core.executor = executor = _Blocking()
    loop = EngineLoop(core).start()
    first = _Collector(["first", "second"])
    loop.submit(_req("a", rid="first", max_tokens=2), first.sink)
    assert executor.entered.wait(20)
    second = _req("a", rid="second", max_tokens=2)
    loop.submit(second, first.sink)  # waits: the only slot is taken
    loop.stop(timeout=0.05)  # the engine thread is still inside its step
    assert not loop.running
    with pytest.raises(EngineStopped):
        loop.submit(_req("a", rid="late", max_tokens=2), lambda ev: None)
    executor.release.set()
    events = first.wait()  # its prefill ends the step; the loop then ends it, as it ends every request in flight
    last = events["first"][-1]
    assert (last.finish_reason, last.error) == ("error", "the server is shutting down")
    assert [t for e in events["first"] for t in e.token_ids] == [ord("b")]
    (waited,) = events["second"]
    assert (waited.finish_reason, waited.error, waited.token_ids) == ("error", "the server is shutting down", [])
    assert (second.finish_reason, second.error) == ("error", "the server is shutting down")
    loop._thread.join(20)
    assert not loop._thread.is_alive()


def test_a_request_the_core_cannot_admit_ends_with_an_error_event():
    loop = EngineLoop(_core(num_slots=1, max_len=8, isolate_errors=True)).start()
    try:
        got = _Collector(["long", "fits"])
        loop.submit(_req("abcde", rid="long", max_tokens=4), got.sink)  # 5 + 4 > 8
        loop.submit(_req("abcde", rid="fits", max_tokens=3), got.sink)
        events = got.wait()
        (only,) = events["long"]
        assert only.finish_reason == "error" and "exceeds the model's context of 8" in only.error
        assert only.token_ids == []
        assert [t for e in events["fits"] for t in e.token_ids] == [ord("f"), ord("g"), ord("h")]
        assert events["fits"][-1].finish_reason == "length"
    finally:
        loop.stop()


def test_an_engine_failure_ends_the_requests_in_flight_and_the_loop_goes_on():
    core = _core(num_slots=2)  # errors not isolated: the step itself raises
    core.executor = _FailOn(ord("~"))
    loop = EngineLoop(core).start()
    try:
        got = _Collector(["bad"])
        loop.submit(_req("~", rid="bad", max_tokens=3), got.sink)
        (only,) = got.wait()["bad"]
        assert (only.finish_reason, only.error) == ("error", "engine failure: RuntimeError: injected failure")
        assert loop.running and loop.fatal_error is None and len(core.free_slots) == 2
        after = _Collector(["after"])
        loop.submit(_req("a", rid="after", max_tokens=2), after.sink)
        assert [t for e in after.wait()["after"] for t in e.token_ids] == [ord("b"), ord("c")]
    finally:
        loop.stop()


# ------------------------------------------------------------------ stop conditions and counts


def test_a_stop_token_ends_the_request_and_its_text_is_left_out():
    core = _core()
    req = _req("a", max_tokens=10, stop_token_ids=[ord("d")])
    core.admit(req)
    _drain(core)
    out = req.output()
    assert (out.finish_reason, out.token_ids, out.text) == ("stop", [ord("b"), ord("c"), ord("d")], "bc")
    assert (out.metrics["prompt_tokens"], out.metrics["generated_tokens"]) == (1, 3)


def test_an_eos_token_ends_the_request_and_its_text_is_left_out():
    core = _core()
    req = _req("a", eos=[ord("c")], max_tokens=10)
    core.admit(req)
    _drain(core)
    assert (req.finish_reason, req.output_ids, req.text) == ("stop", [ord("b"), ord("c")], "b")


def test_timing_metrics_count_from_the_first_token(monkeypatch):
    import types

    from nonstop.engine import requests

    clock = iter([11.0, 12.0, 13.5])  # the three tokens' arrival times
    monkeypatch.setattr(requests, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    req = Request("r", None, [97], SamplingParams(max_tokens=3, temperature=0), frozenset(), arrival=10.0)
    tok = ByteTokenizer(V)
    for t in (98, 99, 100):
        req.append(t, tok)
    m = req.output().metrics
    assert req.finish_reason == "length"
    assert m["time_to_first_token_s"] == 1.0
    assert m["decode_time_s"] == 2.5
    assert m["decode_tokens_per_s"] == pytest.approx(2 / 2.5)


def test_stopping_a_finished_request_keeps_its_finish_reason():
    req = _req("a", max_tokens=1)
    req.append(ord("b"), ByteTokenizer(V))
    assert req.finish_reason == "length"
    finished_at = req.finished_at
    req.stop("abort")
    assert (req.finish_reason, req.finished_at) == ("length", finished_at)


# ------------------------------------------------------------------ sampling parameters


@pytest.mark.parametrize("name", ["logprobs", "prompt_logprobs"])
def test_a_negative_logprobs_count_is_refused(name):
    with pytest.raises(InvalidSamplingParam, match=name) as info:
        SamplingParams(**{name: -1})
    assert info.value.param == name
    assert getattr(SamplingParams(**{name: 0}), name) == 0


def test_sample_without_a_history_applies_no_penalty():
    logits = torch.tensor([0.0, 2.0, 1.0])
    params = SamplingParams(temperature=0, repetition_penalty=5.0, frequency_penalty=2.0)
    assert sample(logits, params, None) == 1  # nothing seen: nothing to penalise


def test_min_p_is_applied_when_sampling():
    # p(1) / p(0) = e^-0.1 = 0.905 < 0.95: min_p 0.95 leaves token 0 alone, whatever the noise
    logits = torch.tensor([2.0, 1.9, 1.8, 1.7])
    params = SamplingParams(temperature=1.0, min_p=0.95, seed=0)
    assert {sample(logits, params, None, None, position) for position in range(64)} == {0}
    free = SamplingParams(temperature=1.0, seed=0)
    assert len({sample(logits, free, None, None, position) for position in range(64)}) > 1


def test_numpy_numbers_are_taken_as_pythons():
    np = pytest.importorskip("numpy")
    params = SamplingParams(
        max_tokens=np.int64(5), temperature=np.float32(0.5), seed=np.uint64(3), logprobs=np.int32(2)
    )
    assert (params.max_tokens, params.temperature, params.seed, params.logprobs) == (5, 0.5, 3, 2)
    assert all(type(v) in (int, float) for v in (params.max_tokens, params.temperature, params.seed, params.logprobs))


# ------------------------------------------------------------------ LLM.generate over the scripted executor


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = synth_checkpoint("k3", tmp_path_factory.mktemp("k3"))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, ord("e")], "temperature": 0.5}))
    llm = LLM(path, backend="reference", max_batch=1, tokenizer="bytes")
    llm.executor = Scripted()
    return llm


def test_generation_config_eos_ids_end_generation(llm):
    assert llm.eos_ids == {2, ord("e")}
    out = llm.generate(["a"], SamplingParams(max_tokens=10, temperature=0))[0]
    assert (out.finish_reason, out.text, out.token_ids) == ("stop", "bcd", [ord(c) for c in "bcde"])


def test_default_sampling_skips_overrides_that_are_none(llm):
    params = llm.default_sampling(max_tokens=7, temperature=None, seed=None)
    assert (params.max_tokens, params.temperature, params.seed) == (7, 0.5, None)


def test_prompts_are_admitted_in_order(llm):
    outs = llm.generate(["a", "f", "k"], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    assert [o.text for o in outs] == ["bcdefghijklmnopqrstu", "ghijklmnopqrstuvwxyz", "lmnopqrstuvwxyz{|}~\x7f"]
    first = [o.metrics["time_to_first_token_s"] for o in outs]  # one slot: each waits for those before it
    assert first == sorted(first)


def test_prompt_ids_must_lie_inside_the_vocabulary(llm):
    vocab = llm.cfg.vocab_size
    with pytest.raises(ValueError, match=f"token id {vocab} is outside the vocabulary"):
        llm.generate(prompt_token_ids=[[1, vocab]])
    assert llm.generate(prompt_token_ids=[[vocab - 1]], sampling=SamplingParams(max_tokens=1))[0].token_ids


class _CompilesOnce(Scripted):
    """Reports 4 s of compiling (as the cpu backend's stats do) during its first forward."""

    def __init__(self):
        super().__init__()
        self.stats = {"compiling_s": 0.0}

    def forward(self, ids, cache, batch, last_only=False):
        if not self.calls:
            self.stats["compiling_s"] += 4.0
        return super().forward(ids, cache, batch, last_only)


def test_compiling_before_the_first_token_is_not_charged_to_decode(llm, monkeypatch):
    monkeypatch.setattr(llm, "executor", _CompilesOnce())
    out = llm.generate(["a"], SamplingParams(max_tokens=3, temperature=0))[0]
    assert out.metrics["decode_compiling_s"] == 0.0  # the prefill step compiled: time to first token holds it


def test_make_requests_keeps_the_callers_request_id(llm):
    one = llm.make_requests("a", None, SamplingParams(max_tokens=2), request_id="cmpl-7")
    assert [r.request_id for r in one] == ["cmpl-7"]
    two = llm.make_requests("a", None, SamplingParams(max_tokens=2, n=2, seed=5), request_id="cmpl-8")
    assert [(r.request_id, r.params.seed) for r in two] == [("cmpl-8-0", 5), ("cmpl-8-1", 6)]


@pytest.mark.parametrize("slots", [1, 3])
def test_warm_up_prefills_a_many_token_prompt_alone_and_frees_every_slot(slots):
    core = _core(num_slots=slots)
    warm_up(core, lambda prompt, ids, params: Request("w", prompt, ids, params, frozenset()))
    assert [[0, 0]] in core.executor.calls  # one row of a two-token prompt: the prefill shape of most traffic
    assert [[0]] in core.executor.calls
    assert not core.active and sorted(core.free_slots) == list(range(slots))
