"""EngineLoop behaviours a mutation audit of ``nonstop/engine/loop.py`` found unpinned: the waiting-queue bound at
exactly ``max_waiting``, slots being admitted (``_admitting``) not counted as free, the sink table emptied when a
request finishes, streamed logprob rows that are the new ones only, and the step counter.

The engine runs over the scripted executor (no model): each row's next token is ``(last + 1) % V`` with logit
``LEAD``, every other logit 0, so every token and logprob follows by hand.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.engine.core import EngineCore
from nonstop.engine.loop import EngineLoop, EngineOverloaded
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import ByteTokenizer
from tests.engine.scripted_executor import LEAD, Scripted, V
from tests.engine.tiny_models import TINY_MODELS

LOGPROB_NEXT = LEAD - math.log(math.exp(LEAD) + V - 1)  # log softmax of the leading token, by hand


def _core(num_slots=1) -> EngineCore:
    cfg = ModelConfig.from_file(TINY_MODELS["k3"])
    return EngineCore(cfg, Scripted(), ByteTokenizer(V), num_slots, torch.float32, "cpu")


def _req(rid: str, max_tokens=3, **params) -> Request:
    return Request(rid, None, [10, 11, 12], SamplingParams(max_tokens=max_tokens, temperature=0, **params), frozenset())


class _Idle(EngineLoop):
    """A loop that reports running but never runs a step: submit's bookkeeping alone."""

    @property
    def running(self) -> bool:
        return True


def test_the_queue_refuses_exactly_at_max_waiting_once_slots_are_claimed():
    loop = _Idle(_core(num_slots=1), max_waiting=2)
    sink = lambda e: None  # noqa: E731
    loop.submit(_req("a"), sink)  # takes the free slot at the next boundary: not waiting for one
    loop.submit(_req("b"), sink)  # 1 waiting
    loop.submit(_req("c"), sink)  # 2 waiting: the limit reached
    with pytest.raises(EngineOverloaded, match="2 requests are already waiting"):
        loop.submit(_req("d"), sink)  # a 3rd would pass max_waiting = 2


def test_slots_being_admitted_are_not_offered_again_to_submit():
    loop = _Idle(_core(num_slots=2), max_waiting=1)
    sink = lambda e: None  # noqa: E731
    loop._admitting = 2  # both free slots taken off the queue by the engine thread, their admit not done yet
    loop.submit(_req("a"), sink)  # waits: no unclaimed slot, 1 waiting = the limit
    with pytest.raises(EngineOverloaded):
        loop.submit(_req("b"), sink)


def _run(reqs, num_slots=1):
    loop = EngineLoop(_core(num_slots)).start()
    events: dict[str, list] = {r.request_id: [] for r in reqs}
    done = threading.Event()
    left = [len(reqs)]

    def sink(event):
        events[event.request.request_id].append(event)
        if event.finished:
            left[0] -= 1
            if not left[0]:
                done.set()

    try:
        for r in reqs:
            loop.submit(r, sink)
        assert done.wait(30)
    finally:
        loop.stop()
    return loop, events


@pytest.mark.timeout(60)
def test_streamed_logprob_rows_are_only_the_new_tokens_and_sinks_are_forgotten_at_the_end():
    loop, events = _run([_req("a", max_tokens=4, logprobs=0), _req("b", max_tokens=2, logprobs=0)])
    for rid, want in (("a", 4), ("b", 2)):
        got = events[rid]
        ids = [t for e in got for t in e.token_ids]
        rows = [row for e in got for row in e.logprobs]
        assert ids == [(12 + 1 + i) % V for i in range(want)]  # the scripted next-token rule, by hand
        assert len(rows) == want  # one row per generated token, none repeated
        for tok, row in zip(ids, rows):
            assert row == {tok: pytest.approx(LOGPROB_NEXT, abs=1e-5)}
        assert all(len(e.logprobs) == len(e.token_ids) for e in got)
    assert loop._sinks == {}  # a finished request leaves nothing behind (a leak per request otherwise)


@pytest.mark.timeout(60)
def test_steps_counts_one_per_core_step():
    # one slot, prompt of 3 then 3 tokens: step 1 prefills and samples token 1, steps 2 and 3 decode tokens 2, 3
    loop, events = _run([_req("a", max_tokens=3)])
    assert [t for e in events["a"] for t in e.token_ids] == [13, 14, 15]
    assert loop.steps == 3


class _SlowAdmit(EngineCore):
    """A core whose ``admit`` waits for ``go``: the engine thread holds a request taken off the queue."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.entered, self.go = threading.Event(), threading.Event()

    def admit(self, req):
        self.entered.set()
        assert self.go.wait(30)
        super().admit(req)


@pytest.mark.timeout(60)
def test_a_request_being_admitted_by_the_engine_thread_holds_its_slot_for_submit():
    cfg = ModelConfig.from_file(TINY_MODELS["k3"])
    core = _SlowAdmit(cfg, Scripted(), ByteTokenizer(V), 1, torch.float32, "cpu")
    loop = EngineLoop(core, max_waiting=1).start()
    sink = lambda e: None  # noqa: E731
    try:
        loop.submit(_req("a"), sink)
        assert core.entered.wait(30)  # "a" is off the queue, its admit not done: the one slot still looks free
        loop.submit(_req("b"), sink)  # waits for the slot "a" is taking: 1 waiting, the limit
        with pytest.raises(EngineOverloaded):
            loop.submit(_req("c"), sink)
    finally:
        core.go.set()
        loop.stop()
