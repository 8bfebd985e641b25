"""The 400 threshold of a call's completions (``num_slots + max_waiting``) and the free slots counted after
earlier admissions (``EngineLoop._admitting`` returns to 0 once a request is admitted).

A real uvicorn server in a thread serves the tiny K3 model of the server tests; an idle engine with 2 slots
and ``--max-waiting 1`` holds 3 completions at once: 2 take the free slots, 1 waits."""

from __future__ import annotations

import httpx
import pytest

from nonstop.engine.llm import LLM
from nonstop.server import build_context
from tests.server.conftest import MODEL_NAME
from tests.server.inprocess import serve_in_thread

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, dtype="float32", max_batch=2, batch_invariant=True)


def _complete(url: str, n: int) -> httpx.Response:
    body = {"model": MODEL_NAME, "prompt": "The", "max_tokens": 2, "temperature": 0, "ignore_eos": True, "n": n}
    return httpx.post(url + "/v1/completions", json=body, timeout=60)


def test_a_call_of_slots_plus_queue_completions_is_served_after_earlier_calls(llm):
    """Catches the 400 threshold counting the queue alone or refusing a call of exactly slots + queue
    completions, and admissions that never give back their claim on the free slots (a later burst on an
    idle engine refused with 429): on an idle 2-slot server with ``--max-waiting 1`` a call with n=3 is
    served (200, 3 choices), before and after other calls ran; n=4 is refused with 400."""
    ctx = build_context(llm, [MODEL_NAME], max_batch=2, max_waiting=1)
    with serve_in_thread(ctx) as url:
        first = _complete(url, 1)
        assert first.status_code == 200, first.text
        for _ in range(2):
            reply = _complete(url, 3)
            assert reply.status_code == 200, reply.text
            assert len(reply.json()["choices"]) == 3
        too_many = _complete(url, 4)
    assert too_many.status_code == 400, too_many.text
    assert too_many.json()["error"]["code"] == "too_many_completions"


def test_a_request_admitted_in_this_step_does_not_hide_a_free_slot(llm):
    """Catches the engine's claim on free slots (``_admitting``) kept after the admission it counted: while
    a 2-slot engine (``--max-waiting 1``) is inside the step that admitted a first request, one slot is
    free, so of two more calls one takes it and one waits; neither is refused with 429. With the stale claim
    the free slot is counted as taken and the third call is refused."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.server.test_queue_limit_gaps import _Gated

    g = _Gated(llm, max_batch=2, max_waiting=1)
    pool = ThreadPoolExecutor(3)
    with serve_in_thread(g.ctx) as url:
        try:
            holder = pool.submit(_complete, url, 1)
            g.wait(lambda: g.engine.num_active == 1, "the first request to take a slot")
            second = pool.submit(_complete, url, 1)
            g.wait(lambda: g.engine.num_waiting == 1, "the second request to be queued")
            third = pool.submit(_complete, url, 1)
            g.wait(lambda: third.done() or g.engine.num_waiting == 2, "the third request to be answered or queued")
        finally:
            g.gate.set()
        replies = [f.result(60) for f in (holder, second, third)]
        pool.shutdown()
    assert [r.status_code for r in replies] == [200, 200, 200], [r.text for r in replies]
