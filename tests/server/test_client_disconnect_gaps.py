"""Fault injection: a client that goes away. A real uvicorn server (in a thread of this process, so the
test can read the engine) serves a tiny K3 model whose steps are slowed to a few milliseconds; a raw socket
closes mid-stream (after the first SSE chunk), before a whole response is ready, or while its request still
waits for a slot. Checked: the engine request ends as ``abort`` well before its token budget, its slot and
cache pages go back (and are reused), the engine stops stepping, a concurrent request's tokens are exactly
those it gets alone, and nothing is logged at warning level or above. The same paths are then driven
through the ASGI app directly with a ``receive`` that reports ``http.disconnect``."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time

import httpx
import pytest

from nonstop.engine.llm import LLM
from nonstop.server import build_context, create_app
from tests.server.conftest import MODEL_NAME
from tests.server.inprocess import serve_in_thread

pytestmark = pytest.mark.timeout(120)

LONG = 200  # the token budget of the request that is abandoned (ignore_eos: it would run all of it)
STEP_S = 0.004  # added to every engine step, so that LONG tokens take about a second at the least


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, dtype="float32", max_batch=2, batch_invariant=True)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


class _Served:
    """A served context with its engine's submissions recorded and its steps slowed."""

    def __init__(self, llm, max_batch: int):
        self.ctx = build_context(llm, [MODEL_NAME], max_batch=max_batch)
        self.engine = self.ctx.engine
        self.core = self.engine.core
        self.submitted: list = []
        real_submit, real_step = self.engine.submit, self.core.step

        def submit(req, sink):
            self.submitted.append(req)
            real_submit(req, sink)

        def step(*args, **kw):
            time.sleep(STEP_S)
            return real_step(*args, **kw)

        self.engine.submit = submit
        self.core.step = step

    def wait(self, condition, timeout: float = 10.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.01)

    def assert_idle_and_clean(self) -> None:
        """No request holds a slot, every slot and cache page is free, and the engine has stopped stepping."""
        every_slot = list(range(self.core.cache.num_slots))

        def idle() -> bool:  # read from this thread while the engine thread ends the request: waited for, whole
            return (
                self.engine.num_active == 0
                and self.engine.num_waiting == 0
                and sorted(self.core.free_slots) == every_slot
                and self.core.cache.pages.used_pages == 0
            )

        self.wait(idle, what="the engine to idle with every slot and cache page free")
        time.sleep(0.2)  # the step that freed the last slot is counted once its events are sent
        steps = self.engine.steps
        time.sleep(0.3)
        assert self.engine.steps == steps, "the engine keeps stepping with nothing to do"


def _body(prompt: str, max_tokens: int, stream: bool) -> dict:
    return {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        "logprobs": 1,
    }


def _raw_post(url: str, body: dict) -> socket.socket:
    """Send a completion request on a raw socket (the caller reads, then closes it)."""
    port = int(url.rsplit(":", 1)[1])
    data = json.dumps(body).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(head + data)
    return sock


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    got = b""
    while marker not in got:
        chunk = sock.recv(4096)
        assert chunk, f"the server closed the connection before {marker!r}: {got!r}"
        got += chunk
    return got


def _complete(url: str, prompt: str, max_tokens: int) -> tuple[list, str]:
    r = httpx.post(url + "/v1/completions", json=_body(prompt, max_tokens, False), timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return list(zip(choice["logprobs"]["tokens"], choice["logprobs"]["token_logprobs"])), choice["finish_reason"]


def _in_thread(fn, *args):
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _joined(t: threading.Thread, out: dict):
    t.join(60)
    assert not t.is_alive(), "the concurrent request never finished"
    if "error" in out:
        raise out["error"]
    return out["value"]


def _metric(url: str, sample: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == sample:
            return float(value)
    return 0.0


@pytest.fixture
def served(llm):
    """(the served context, its base URL, the warning records logged while it served); afterwards no
    server, engine or client thread of the test is left."""
    before = set(threading.enumerate())
    s = _Served(llm, max_batch=2)
    records = _Records()
    with serve_in_thread(s.ctx) as url:
        watched = [logging.getLogger(n) for n in ("", "uvicorn", "uvicorn.error", "nonstop")]
        for logger in watched:
            logger.addHandler(records)
        try:
            yield s, url, records
        finally:
            for logger in watched:
                logger.removeHandler(records)
    assert not s.engine.running
    deadline = time.monotonic() + 10
    while (left := [t for t in set(threading.enumerate()) - before if t.is_alive()]) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [t for t in left if t.name.startswith(("nonstop", "test-uvicorn", "Thread-"))]
    assert not left, f"threads left behind: {left}"


def _no_warnings(records: _Records) -> None:
    shown = [(r.name, r.levelname, r.getMessage(), r.exc_info is not None) for r in records.records]
    assert not shown, shown


def test_a_stream_closed_after_its_first_chunk_is_aborted_and_its_neighbour_is_undisturbed(served):
    """Catches a stream whose client left but whose request goes on decoding (the cancel dropped from the
    stream's cleanup, the submission's ``finally`` or the engine's cancel handling), a cancel that frees the
    wrong slot or not the cache pages (the neighbour's tokens change, pages leak), and a traceback logged
    for a client that merely left."""
    s, url, records = served
    alone = _complete(url, "The other one", 24)
    assert alone[1] == "length" and len(alone[0]) == 24
    s.wait(lambda: s.engine.num_active == 0, what="the first request's slot")
    aborted = 'nonstop_request_finish_total{reason="abort"}'
    aborted_before = _metric(url, aborted)

    sock = _raw_post(url, _body("Going away", LONG, True))
    try:
        head = _read_until(sock, b"data: {")
        assert b" 200 OK" in head.split(b"\r\n", 1)[0]
        gone = s.submitted[-1]
        t, out = _in_thread(_complete, url, "The other one", 24)
        s.wait(lambda: s.engine.num_active == 2, what="both requests to hold slots")
        assert not gone.finished
    finally:
        sock.close()
    s.wait(lambda: gone.finished, what="the abandoned stream to end")
    assert gone.finish_reason == "abort"
    assert len(gone.output_ids) < LONG // 2  # ended at the next step boundary, not after the whole budget
    assert _joined(t, out) == alone  # the neighbour's tokens and logprobs, bit for bit
    s.assert_idle_and_clean()
    assert _metric(url, aborted) == aborted_before + 1
    # the freed slot is reused: two requests at once on a two-slot engine both complete
    t2, out2 = _in_thread(_complete, url, "The other one", 24)
    assert _complete(url, "Going away", 3)[1] == "length"
    assert _joined(t2, out2) == alone
    s.assert_idle_and_clean()
    _no_warnings(records)


def test_a_client_that_leaves_before_its_whole_response_is_ready_frees_the_slot(served):
    """Catches the non-streamed path's disconnect poll dropped or inverted (the request decodes its whole
    budget for nobody, or a connected client's request is cancelled), the cancel after ``events`` dropped,
    and the 499 (client closed) not counted."""
    s, url, records = served
    alone = _complete(url, "Stays", 16)
    sock = _raw_post(url, _body("Leaves early", LONG, False))
    try:
        s.wait(lambda: s.engine.num_active == 1 and len(s.submitted) == 2, what="the request to hold a slot")
        gone = s.submitted[-1]
        t, out = _in_thread(_complete, url, "Stays", 16)
        s.wait(lambda: s.engine.num_active == 2, what="both requests to hold slots")
        assert not gone.finished
    finally:
        sock.close()
    s.wait(lambda: gone.finished, timeout=5, what="the abandoned request to end")
    assert gone.finish_reason == "abort"
    assert len(gone.output_ids) < LONG // 2
    assert _joined(t, out) == alone
    s.assert_idle_and_clean()
    s.wait(
        lambda: _metric(url, 'nonstop_requests_total{endpoint="/v1/completions",status="499"}') == 1,
        what="the 499 to be counted",
    )
    assert _metric(url, 'nonstop_request_finish_total{reason="abort"}') == 1
    assert _complete(url, "Leaves early", 3)[1] == "length"  # slot reused
    _no_warnings(records)


def test_a_client_that_leaves_while_its_request_waits_for_a_slot_never_runs_it(llm):
    """Catches a cancel that does not reach the waiting queue (the request would be admitted and decode for
    nobody once the slot frees) and one that ends the running neighbour instead."""
    s = _Served(llm, max_batch=1)
    with serve_in_thread(s.ctx) as url:
        t, out = _in_thread(_complete, url, "Holds the slot", 60)
        s.wait(lambda: s.engine.num_active == 1, what="the first request to hold the slot")
        sock = _raw_post(url, _body("Never runs", LONG, False))
        try:
            s.wait(lambda: len(s.submitted) == 2 and s.engine.num_waiting == 1, what="the second to wait")
            waiting = s.submitted[-1]
        finally:
            sock.close()
        s.wait(lambda: waiting.finished, timeout=5, what="the waiting request to be dropped")
        assert waiting.finish_reason == "abort" and waiting.output_ids == [] and waiting.slot == -1
        tokens, reason = _joined(t, out)
        assert reason == "length" and len(tokens) == 60
        s.assert_idle_and_clean()
        assert waiting.output_ids == []


# ------------------------------------------------------------------ the ASGI app, driven directly


def _completions_scope(body: bytes | None = None) -> dict:
    """The ASGI scope of a POST /v1/completions (with the body's Content-Length when given)."""
    headers = [(b"content-type", b"application/json")]
    if body is not None:
        headers.append((b"content-length", str(len(body)).encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }


async def _asgi_call(app, body: dict, disconnect_when) -> tuple[list[dict], int]:
    """POST ``body`` to /v1/completions; ``receive`` gives the body, then reports ``http.disconnect`` once
    ``disconnect_when(sent messages)`` is true. Returns (the messages sent, the number of receive calls)."""
    sent: list[dict] = []
    calls = 0
    changed = asyncio.Event()
    data = json.dumps(body).encode()

    async def receive():
        nonlocal calls
        calls += 1
        if calls == 1:
            return {"type": "http.request", "body": data, "more_body": False}
        while not disconnect_when(sent):
            changed.clear()
            await changed.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        changed.set()

    scope = _completions_scope(data)
    await asyncio.wait_for(app(scope, receive, send), 30)
    return sent, calls


@pytest.mark.parametrize("stream", [True, False])
def test_the_app_cancels_the_engine_request_when_receive_reports_a_disconnect(llm, stream):
    """Catches, at the ASGI level, a disconnect that does not cancel the engine request (stream: after the
    first body chunk; whole response: at once) and a whole response sent to a client that left."""
    s = _Served(llm, max_batch=2)
    app = create_app(s.ctx, manage_engine=False)
    s.engine.start()
    try:
        if stream:

            def gone(sent):  # after the first SSE chunk with a token
                return any(m["type"] == "http.response.body" and b"data: {" in m.get("body", b"") for m in sent)
        else:

            def gone(sent):
                return True

        sent, _ = asyncio.run(_asgi_call(app, _body("ASGI", LONG, stream), gone))
        req = s.submitted[-1]
        s.wait(lambda: req.finished, timeout=5, what="the engine request to end")
        assert req.finish_reason == "abort" and len(req.output_ids) < LONG // 2
        s.assert_idle_and_clean()
        starts = [m for m in sent if m["type"] == "http.response.start"]
        if stream:
            assert starts[0]["status"] == 200
            assert b"[DONE]" not in b"".join(m.get("body", b"") for m in sent)
        else:
            assert [m["status"] for m in starts] == [499]
    finally:
        s.engine.stop()
    assert not s.engine.running


def test_a_stream_cancelled_while_a_chunk_is_being_sent_still_cancels_at_once(llm):
    """Catches the StreamingResponse's ``background=BackgroundTask(submission.cancel)`` dropped: when the
    client leaves while a chunk is being written, the SSE generator is left suspended at a ``yield`` (its
    own ``finally`` runs only when it is garbage-collected, later), so the background task is what tells
    the engine before the handler returns."""
    s = _Served(llm, max_batch=2)
    cancels: list[str] = []
    real_cancel = s.engine.cancel

    def cancel(request_id):
        cancels.append(request_id)
        real_cancel(request_id)

    s.engine.cancel = cancel
    app = create_app(s.ctx, manage_engine=False)
    s.engine.start()
    data = json.dumps(_body("Blocked", LONG, True)).encode()

    async def run():
        first_chunk, never = asyncio.Event(), asyncio.Event()
        calls = 0

        async def receive():
            nonlocal calls
            calls += 1
            if calls == 1:
                return {"type": "http.request", "body": data, "more_body": False}
            await first_chunk.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.body" and b"data: {" in message.get("body", b""):
                first_chunk.set()
                await never.wait()  # the write never completes: the client is gone

        scope = _completions_scope()
        await asyncio.wait_for(app(scope, receive, send), 30)
        return list(cancels)  # read before anything else runs on this loop (a collected generator's aclose)

    try:
        cancelled_on_return = asyncio.run(run())
        req = s.submitted[-1]
        assert cancelled_on_return == [req.request_id]
        s.wait(lambda: req.finished, timeout=5, what="the engine request to end")
        assert req.finish_reason == "abort" and len(req.output_ids) < LONG // 2
        s.assert_idle_and_clean()
    finally:
        s.engine.stop()
    assert not s.engine.running
