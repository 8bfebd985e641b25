"""The waiting-queue limit (``--max-waiting``) and what a refused or abandoned call leaves behind.

A real uvicorn server (in a thread of this process) serves a tiny K3 model whose engine steps wait on a
gate the test opens: while it is closed, the engine sits inside a step with the first request in a slot,
and every call sent meanwhile stays exactly where the server put it (waiting for a slot, or refused), so
the queue's state at each moment is known without racing the engine. The gate is always opened before
the server stops, so no thread is left behind.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest

from nonstop.engine.llm import LLM
from nonstop.server import build_context
from tests.server.conftest import MODEL_NAME
from tests.server.inprocess import serve_in_thread

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, dtype="float32", max_batch=4, batch_invariant=True)


class _Gated:
    """A served context whose engine steps wait until ``gate`` is set."""

    def __init__(self, llm, max_batch: int, max_waiting: int):
        self.ctx = build_context(llm, [MODEL_NAME], max_batch=max_batch, max_waiting=max_waiting)
        self.engine = self.ctx.engine
        self.gate = threading.Event()
        real_step = self.engine.core.step

        def step(*args, **kw):
            self.gate.wait(60)
            return real_step(*args, **kw)

        self.engine.core.step = step

    def wait(self, condition, what: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.01)


def _body(max_tokens: int = 3, **fields) -> dict:
    return {
        "model": MODEL_NAME,
        "prompt": "The",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    } | (fields)


def _post(url: str, body: dict, path: str = "/v1/completions", timeout: float = 60) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=timeout)


def _metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def _health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=10).json()


def test_requests_that_fit_in_free_slots_are_not_refused_as_queue_full(llm):
    """DEFECT (fails on the current code). Catches the queue limit counting requests that only wait for the
    engine's next step boundary, not for a slot: with 4 slots, 1 taken and ``--max-waiting 1``, a second
    call arriving while the engine is inside a step gets ``429 queue_full`` although 3 slots are free
    (``serve --help``: 429 only "when --max-waiting requests already wait for a slot"). Seen black-box on
    an idle ``nonstop serve --max-batch 8 --max-waiting 1``: 4 simultaneous greedy completions, 2 get 429."""
    g = _Gated(llm, max_batch=4, max_waiting=1)
    pool = ThreadPoolExecutor(4)
    with serve_in_thread(g.ctx) as url:
        try:
            holder = pool.submit(_post, url, _body(4))
            g.wait(lambda: g.engine.num_active == 1, "the first request to take a slot")
            first = pool.submit(_post, url, _body(2))
            g.wait(lambda: g.engine.num_waiting == 1, "the second request to be queued")
            second = pool.submit(_post, url, _body(2))
            g.wait(
                lambda: second.done() or g.engine.num_waiting == 2,
                "the third request to be answered or queued",
            )
        finally:
            g.gate.set()
        replies = [f.result(60) for f in (holder, first, second)]
        pool.shutdown()
    assert [r.status_code for r in replies] == [200, 200, 200], [r.text for r in replies]


def test_a_call_refused_with_429_leaves_the_finish_counters_alone(llm):
    """DEFECT (fails on the current code). Catches a refused call showing up in /metrics as generation
    that ended: an ``n=2`` call that finds one waiting place left has its first completion queued, then
    cancelled when the second does not fit, and that cancelled completion is recorded as
    ``nonstop_request_finish_total{reason="abort"}`` with its prompt tokens in
    ``nonstop_prompt_tokens_total`` although the client got a 429 and nothing was generated (vLLM counts
    no rejected request). Right: the counters move only for the two completions that ran."""
    g = _Gated(llm, max_batch=1, max_waiting=2)
    pool = ThreadPoolExecutor(2)
    with serve_in_thread(g.ctx) as url:
        try:
            holder = pool.submit(_post, url, _body(3))
            g.wait(lambda: g.engine.num_active == 1, "the first request to take the slot")
            waiting = pool.submit(_post, url, _body(3))
            g.wait(lambda: g.engine.num_waiting == 1, "the second request to be queued")
            refused = _post(
                url,
                _body(3, n=2, prompt="A much longer prompt of several words"),
                timeout=10,
            )
        finally:
            g.gate.set()
        ran = [holder.result(60), waiting.result(60)]
        pool.shutdown()
        assert refused.status_code == 429, refused.text
        assert [r.status_code for r in ran] == [200, 200]
        g.wait(
            lambda: _metrics(url).get('nonstop_request_finish_total{reason="length"}') == 2,
            "both to finish",
        )
        time.sleep(0.3)
        after = _metrics(url)
    assert after.get('nonstop_request_finish_total{reason="abort"}', 0) == 0, after
    assert after["nonstop_prompt_tokens_total"] == sum(r.json()["usage"]["prompt_tokens"] for r in ran)
    assert after["nonstop_generation_tokens_total"] == 6  # 3 + 3, ignore_eos


def test_exactly_max_waiting_calls_wait_and_the_next_gets_a_429_with_retry_after(llm):
    """Catches an off-by-one in the queue limit (one place fewer or more than ``--max-waiting``), a 429
    without ``Retry-After`` or OpenAI's error body, a refused streamed call that starts a 200 stream, and a
    server that does not serve the waiting calls (and a later one) once the slot frees."""
    g = _Gated(llm, max_batch=1, max_waiting=2)
    pool = ThreadPoolExecutor(3)
    with serve_in_thread(g.ctx) as url:
        try:
            holder = pool.submit(_post, url, _body(2))
            g.wait(lambda: g.engine.num_active == 1, "the first request to take the slot")
            waiting: list[Future] = []
            for k in range(2):
                waiting.append(pool.submit(_post, url, _body(2)))
                g.wait(lambda k=k: g.engine.num_waiting == k + 1, f"queued request {k + 1}")
            assert _health(url)["queue_depth"] == 2
            # refused at once: a call that is queued instead would wait for the gate, so give up after 10 s
            whole = _post(url, _body(2), timeout=10)
            streamed = _post(url, _body(2, stream=True), timeout=10)
            hi = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]}
            chat = _post(url, hi, "/v1/chat/completions", timeout=10)
        finally:
            g.gate.set()
        ran = [f.result(60) for f in (holder, *waiting)]
        later = _post(url, _body(2))
        pool.shutdown()
    for r in (whole, streamed, chat):
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_full" and r.json()["error"]["type"] == "rate_limit_error"
    assert [r.status_code for r in ran] == [200, 200, 200], [r.text for r in ran]
    assert later.status_code == 200 and later.json()["usage"]["completion_tokens"] == 2


def test_a_stream_whose_client_leaves_while_it_waits_for_a_slot_never_runs(llm):
    """Catches a streamed call whose client closed the connection before its first byte (nothing is sent
    to a streamed completion until its first token, so only the disconnect listener can notice) still
    being admitted and decoded for nobody once the slot frees: it must end as ``abort`` with no tokens,
    and the running request must be undisturbed."""
    g = _Gated(llm, max_batch=1, max_waiting=4)
    pool = ThreadPoolExecutor(1)
    with serve_in_thread(g.ctx) as url:
        port = int(url.rsplit(":", 1)[1])
        try:
            holder = pool.submit(_post, url, _body(5))
            g.wait(lambda: g.engine.num_active == 1, "the first request to take the slot")
            data = json.dumps(_body(50, stream=True)).encode()
            head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            head += f"Content-Length: {len(data)}\r\n\r\n"
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(head.encode() + data)
            g.wait(lambda: g.engine.num_waiting == 1, "the stream to be queued")
            sock.close()
            time.sleep(0.3)  # the server notices the close while the engine is still inside its step
        finally:
            g.gate.set()
        done = holder.result(60)
        pool.shutdown()
        g.wait(
            lambda: _metrics(url).get('nonstop_request_finish_total{reason="abort"}') == 1,
            "the stream's abort",
        )
        g.wait(
            lambda: g.engine.num_active == 0 and g.engine.num_waiting == 0,
            "the engine to idle",
        )
        after = _metrics(url)
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 5
    assert after["nonstop_generation_tokens_total"] == 5, after  # the abandoned stream generated nothing
