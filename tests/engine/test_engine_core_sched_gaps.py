"""EngineCore / EngineLoop / Request scheduling details that a mutation audit found untested.

The engine runs over a scripted executor (no model): every row's next token is ``(last + 1) % V``, so the
tokens each request must produce follow by hand, and the executor records every forward's input ids.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.engine.core import EngineCore
from nonstop.engine.loop import EngineLoop
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import ByteTokenizer
from tests.engine.scripted_executor import Scripted, ScriptedCache, V
from tests.engine.tiny_models import TINY_MODELS


def _core(num_slots=2, prefill_chunk=None, executor=None, **kw) -> EngineCore:
    cfg = ModelConfig.from_file(TINY_MODELS["k3"])
    ex = executor or Scripted()
    return EngineCore(cfg, ex, ByteTokenizer(V), num_slots, torch.float32, "cpu", None, prefill_chunk, **kw)


def _req(ids, rid="r", **params) -> Request:
    params.setdefault("temperature", 0)
    return Request(rid, None, list(ids), SamplingParams(**params), frozenset())


def _next(last: int, n: int) -> list[int]:
    return [(last + 1 + i) % V for i in range(n)]


def test_admitting_with_no_free_slot_is_refused_clearly():
    """A full core refuses a new request with its own RuntimeError (not an IndexError from an empty free
    list) and leaves the request out of the batch."""
    core = _core(num_slots=1)
    core.admit(_req([1, 2], rid="a", max_tokens=3))
    late = _req([5], rid="b", max_tokens=3)
    with pytest.raises(RuntimeError, match="no free slot"):
        core.admit(late)
    assert late not in core.active and late.slot == -1


def test_add_prefills_every_chunk_of_a_long_prompt():
    """``add`` prefills the whole prompt even with a small prefill chunk and returns the first token's text
    (only its first chunk would leave the request prefilling with no token)."""
    core = _core(num_slots=1, prefill_chunk=2)
    req = _req([60, 61, 62, 63, 64], max_tokens=3)
    text = core.add(req)
    assert req.prefilled == 5 and req in core.running
    assert req.output_ids == [65] and text == chr(65)
    assert core.executor.calls == [[[60, 61]], [[62, 63]], [[64]]]


def test_a_step_reports_only_requests_that_produced_a_token_or_ended():
    """A request whose step ran only a middle prefill chunk is not in the step's output (an empty report per
    chunk would reach the client as an empty, unfinished stream event)."""
    core = _core(num_slots=1, prefill_chunk=2)
    req = _req([70, 71, 72, 73, 74], max_tokens=2)
    core.admit(req)
    assert core.step() == []
    assert core.step() == []
    assert core.step() == [(req, chr(75))]


def test_an_executor_that_is_batch_invariant_itself_runs_rows_together():
    """With batch_invariant asked for and an executor that is batch invariant itself, the rows share one
    forward (splitting them runs B forwards for nothing)."""
    ex = Scripted(batch_invariant=True)
    core = _core(num_slots=2, executor=ex, batch_invariant=True)
    a, b = _req([10], rid="a", max_tokens=2), _req([20], rid="b", max_tokens=2)
    core.admit(a)
    core.admit(b)
    core.step()  # both prefills
    ex.calls.clear()
    core.step()
    assert ex.calls == [[[11], [21]]]
    assert a.output_ids == _next(10, 2) and b.output_ids == _next(20, 2)


def test_each_finished_or_aborted_slot_is_reset_and_freed_once():
    """Slot 0 is freed like any other (a ``slot > 0`` test would leak it), its cache is reset when released,
    and aborting an already finished request frees nothing twice."""
    core = _core(num_slots=2)
    a, b = _req([1], rid="a", max_tokens=1), _req([2], rid="b", max_tokens=4)
    core.admit(a)
    core.admit(b)
    slots = {a.slot, b.slot}
    assert slots == {0, 1}
    core.cache.resets.clear()
    core.step()  # a finishes at its first token
    assert a.finish_reason == "length" and a.slot == -1
    core.abort(a)
    core.abort(b)
    assert sorted(core.free_slots) == [0, 1]
    assert sorted(core.cache.resets) == [0, 1]
    assert b.finish_reason == "abort" and a.finish_reason == "length"


def test_the_cache_length_counts_the_prompt_and_the_fed_back_tokens():
    """Each forward advances its slot's cache length: after a prompt of 3 and one decode step
    the slot holds exactly 4 tokens (the sampled token is not in the cache until it is fed back)."""
    core = _core(num_slots=1)
    req = _req([30, 31, 32], max_tokens=5)
    core.admit(req)
    core.step()
    assert core.cache.lengths[req.slot] == 3
    core.step()
    assert core.cache.lengths[req.slot] == 4 and req.output_ids == _next(32, 2)


def test_the_loop_counts_only_steps_that_ran():
    """``steps`` counts the engine steps that ran: a request of 3 tokens with a 1-token prompt takes 3 steps
    (one prefill, two decodes); a request refused at admission, with nothing else active, runs none."""
    core = _core(num_slots=1)
    loop = EngineLoop(core).start()
    done = threading.Event()
    events = []

    def sink(ev):
        events.append(ev)
        if ev.finished:
            done.set()

    refused = []
    try:
        too_long = Request("long", None, [1] * 600, SamplingParams(max_tokens=1), frozenset())
        loop.submit(too_long, refused.append)  # refused at admission: no step runs for it
        loop.submit(_req([40], max_tokens=3), sink)
        assert done.wait(10)
        assert [e.finish_reason for e in refused] == ["error"]
        assert [t for e in events for t in e.token_ids] == _next(40, 3)
        assert events[-1].finish_reason == "length"
        assert loop.steps == 3
    finally:
        loop.stop()


def _drain(core) -> list[str]:
    """Step ``core`` until nothing is active; the text pieces of every step, in order."""
    pieces = []
    while core.active:
        pieces += [t for _, t in core.step()]
    return pieces


def test_text_held_for_a_possible_stop_string_is_released_when_the_request_ends_by_length():
    """A tail held back because it could start a stop string comes out with the final event when the
    request ends by length instead; the pieces then add up to the whole text."""
    core = _core(num_slots=1)
    # tokens after 'a' (97): b, c, d; stop "de" makes the final 'd' a possible stop start
    req = _req([97], max_tokens=3, stop=["de"])
    core.admit(req)
    pieces = _drain(core)
    assert req.finish_reason == "length"
    assert "".join(pieces) == "bcd" == req.text


def test_a_stop_string_cut_leaves_only_the_text_before_it():
    """A stop string found across tokens ends the request with ``stop``; the text and the streamed pieces
    hold exactly what came before the stop string."""
    core = _core(num_slots=1)
    req = _req([97], max_tokens=10, stop=["cd"])
    core.admit(req)
    pieces = _drain(core)
    assert req.finish_reason == "stop"
    assert req.text == "b" == "".join(pieces)
    assert req.output_ids == [98, 99, 100]


def test_a_prompts_last_partial_chunk_counts_only_its_remaining_tokens_in_the_budget():
    """With a prefill budget of 4: a 5-token prompt's second chunk is 1 token, so a 2-token prompt shares that
    step (counting the whole prompt again would push it to the next step and delay its first token)."""
    core = _core(num_slots=2, prefill_chunk=4)
    long, short = _req([1, 2, 3, 4, 5], rid="long", max_tokens=1), _req([7, 8], rid="short", max_tokens=1)
    core.admit(long)
    core.admit(short)
    assert core.step() == []  # long's first 4 tokens fill the budget
    assert {r.request_id for r, _ in core.step()} == {"long", "short"}
    assert core.executor.calls == [[[1, 2, 3, 4]], [[5]], [[7, 8]]]


class Flat(Scripted):
    """Equal logits for every token: a sampled token is the argmax of the sampling noise alone."""

    def forward(self, ids, cache, batch, last_only=False):
        self.calls.append(ids.tolist())
        logits = torch.zeros(*ids.shape, V)
        return logits[:, -1] if last_only else logits


def test_a_sampled_token_draws_the_noise_of_its_position_in_the_sequence():
    """A seeded sampled token uses the Philox noise at its own sequence position (prompt length + tokens so
    far), the counter the device sampler uses too; counting from the output alone would make host and
    device draw different tokens."""
    from nonstop.model.philox import gumbel_noise
    from nonstop.runtime.device_sampling import SampleRow

    core = _core(num_slots=1, executor=Flat())
    params = dict(temperature=1.0, seed=1234, max_tokens=4)
    req = _req([3, 4, 5], **params)
    core.admit(req)
    while core.active:
        core.step()
    seed = SampleRow.of(req.params).seed
    expected = [int(gumbel_noise(seed, 3 + i, V).argmax()) for i in range(4)]
    assert req.output_ids == expected


def test_num_active_counts_requests_still_prefilling():
    """A request holding a slot while its prompt is prefilled counts as active (the server's load figures,
    and a caller waiting for the engine to drain, read ``num_active``)."""
    core = _core(num_slots=2, prefill_chunk=2)
    loop = EngineLoop(core)  # not started: the core is driven here
    req = _req([1, 2, 3, 4, 5], max_tokens=2)
    core.admit(req)
    assert loop.num_active == 1
    core.step()
    assert req in core.prefilling and loop.num_active == 1
    while core.active:
        core.step()
    assert loop.num_active == 0


def _idle(loop, timeout=10.0) -> None:
    """Wait until nothing waits or runs (twice in a row, 0.2 s apart)."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < 2:
        assert time.monotonic() < deadline
        quiet = quiet + 1 if loop.num_waiting == 0 and loop.num_active == 0 else 0
        time.sleep(0.2)


def test_a_cancelled_waiting_request_never_runs_afterwards():
    """A request cancelled while it waits for a slot gets one ``abort`` event and never takes a slot later
    (left in the queue, it would run once the slot frees and stream tokens after its final event)."""
    loop = EngineLoop(_core(num_slots=1, isolate_errors=True)).start()
    got = {"running": [], "waiting": []}
    try:
        running = _req([50], rid="running", max_tokens=5)
        waiting = _req([60], rid="waiting", max_tokens=5)
        with loop._cond:  # both queued before the engine thread looks: one slot, so "waiting" waits
            loop.submit(running, got["running"].append)
            loop.submit(waiting, got["waiting"].append)
            loop.cancel("waiting")
        _idle(loop)
        assert [(e.finish_reason, e.token_ids) for e in got["waiting"]] == [("abort", [])]
        assert waiting.output_ids == [] and waiting.slot == -1
        assert [t for e in got["running"] for t in e.token_ids] == _next(50, 5)
    finally:
        loop.stop()


def _recording_sink():
    """(events, done, sink): ``sink`` appends each event to ``events`` and sets ``done`` at the final one."""
    events, done = [], threading.Event()

    def sink(ev):
        events.append(ev)
        if ev.finished:
            done.set()

    return events, done, sink


def test_streamed_logprobs_hold_one_row_per_new_token():
    """Each stream event carries the logprob rows of its own new tokens only: over the stream they add up to
    one row per generated token, each holding that token."""
    loop = EngineLoop(_core(num_slots=1)).start()
    events, done, sink = _recording_sink()
    try:
        loop.submit(_req([80], max_tokens=4, logprobs=0), sink)
        assert done.wait(10)
        rows = [row for e in events for row in e.logprobs]
        tokens = [t for e in events for t in e.token_ids]
        assert tokens == _next(80, 4)
        assert [list(row) for row in rows] == [[t] for t in tokens]
        assert all(len(e.logprobs) == len(e.token_ids) for e in events)
    finally:
        loop.stop()


def test_a_finished_request_gets_no_second_final_event_when_the_loop_stops():
    """A request that finished is forgotten by the loop: stopping the loop later sends its sink nothing more
    (a kept entry would get a second final event, with the shutdown error attached)."""
    loop = EngineLoop(_core(num_slots=1)).start()
    events, done, sink = _recording_sink()
    loop.submit(_req([90], max_tokens=2), sink)
    assert done.wait(10)
    loop.stop()
    assert [e.finish_reason for e in events if e.finished] == ["length"]
    assert all(e.error is None for e in events)


def test_a_loop_that_dies_tells_the_waiting_requests_why():
    """When the loop cannot even clean up after a failed step it dies, and the requests still waiting end
    with the reason it died, not a routine shutdown message."""
    core = _core(num_slots=1)
    loop = EngineLoop(core)
    real_abort, aborts = core.abort, []

    def failing_step():
        raise RuntimeError("step broke")

    def abort_once(req, reason="abort", error=None):
        aborts.append(req.request_id)
        if len(aborts) == 1:
            raise RuntimeError("cleanup broke")
        real_abort(req, reason, error)

    core.step, core.abort = failing_step, abort_once
    waiting_events = []
    done = threading.Event()

    def waiting_sink(ev):
        waiting_events.append(ev)
        done.set()

    loop.start()
    with loop._cond:  # one slot: "first" is admitted, "second" waits
        loop.submit(_req([1], rid="first", max_tokens=2), lambda ev: None)
        loop.submit(_req([2], rid="second", max_tokens=2), waiting_sink)
    assert done.wait(10)
    loop._thread.join(10)
    assert loop.fatal_error == "engine loop died: RuntimeError: cleanup broke"
    (only,) = waiting_events
    assert only.finish_reason == "error" and only.error == loop.fatal_error


def test_warm_up_decodes_its_tokens_even_through_an_end_token():
    """Warm-up requests ignore the end token: with a model whose first token after the warm-up prompt is the
    end token, every request still decodes its 3 tokens, so the decode shapes (B = 1 and B = 2) are run."""
    from nonstop.engine.warmup import warm_up

    core = _core(num_slots=2)
    made = []

    def make_request(prompt, ids, params):
        made.append(Request(f"w{len(made)}", prompt, list(ids), params, frozenset({1})))  # token 1 ends
        return made[-1]

    warm_up(core, make_request)
    assert [r.output_ids for r in made] == [[1, 2, 3]] * 6
    shapes = [(len(c), len(c[0])) for c in core.executor.calls]
    assert (1, 1) in shapes and (2, 1) in shapes
    assert sorted(core.free_slots) == [0, 1]


class _PagePoolRunsOut(ScriptedCache):
    """A cache whose ``fail_at``-th ``batch`` call (1-based) fails as a full page pool would."""

    def __init__(self, num_slots: int, fail_at: int):
        super().__init__(num_slots)
        self.calls, self.fail_at = 0, fail_at

    def batch(self, slots, T):
        self.calls += 1
        if self.calls == self.fail_at:
            raise MemoryError("page pool exhausted")
        return super().batch(slots, T)


class _ScriptedWithFailingPages(Scripted):
    def new_cache(self, cfg, num_slots, dtype, device, page_size):
        return _PagePoolRunsOut(num_slots, fail_at=3)


@pytest.mark.parametrize("isolate", [True, False])
def test_a_failure_growing_the_cache_keeps_what_the_step_already_produced(isolate):
    """Request a (1-token prompt, 2 tokens) decodes its last token in the step where b's prefill (1-token
    chunks: b waits a step) cannot reserve cache pages (the cache's 3rd ``batch``: a's prefill, a's decode,
    b's prefill). a still ends by length with its last token's text and no error; b ends with the error.
    With ``isolate_errors`` only b fails (the reservation was outside the isolation: the MemoryError
    escaped the step and ended every request); without it the loop ends the requests in flight, but a's
    text from earlier in the failed step is delivered (it was dropped: a's final event had empty text and
    the engine-failure error although a had finished)."""
    core = _core(num_slots=2, prefill_chunk=1, executor=_ScriptedWithFailingPages(), isolate_errors=isolate)
    loop = EngineLoop(core)
    got = {"a": [], "b": []}
    with loop._cond:  # both queued before the engine thread looks
        loop.start()
        loop.submit(_req([97], rid="a", max_tokens=2), got["a"].append)
        loop.submit(_req([65], rid="b", max_tokens=2), got["b"].append)
    try:
        _idle(loop)
    finally:
        loop.stop()
    assert "".join(e.text for e in got["a"]) == "bc"
    assert [t for e in got["a"] for t in e.token_ids] == [98, 99]
    assert [(e.finish_reason, e.error) for e in got["a"] if e.finished] == [("length", None)]
    (end,) = [e for e in got["b"] if e.finished]
    assert end.finish_reason == "error" and "MemoryError: page pool exhausted" in end.error
    assert sorted(core.free_slots) == [0, 1]
