"""Stopping ``nonstop serve`` with a request in flight: the request gets the grace period, then ends with a
clean error (no task cancelled under it: no traceback, no bare 500), and a cancelled listener frees its
requests' slots. The server process is started by ``procs.launched`` (killed whatever happens)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import time
from types import SimpleNamespace

import httpx

from nonstop.server.submission import Submission
from tests.dist.procs import launched
from tests.server.in_flight import SilentEngine, long_request, wait_until_up


def test_a_cancelled_listener_cancels_its_unfinished_requests():
    """uvicorn cancels a handler's task past its shutdown grace, anyio a stream's when its client leaves:
    the requests must not keep their slots (the handler's own cleanup may never run)."""
    engine = SilentEngine()
    requests = [SimpleNamespace(request_id="a"), SimpleNamespace(request_id="b")]

    async def main() -> None:
        submission = Submission(engine, None, requests)
        submission.start()

        async def listen() -> None:
            async for _ in submission.events():
                pass

        task = asyncio.create_task(listen())
        await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert sorted(engine.cancelled) == ["a", "b"]


def test_ctrl_c_with_a_long_request_in_flight_answers_it_with_a_clean_error():
    from nonstop.dist.launch import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["-m", "nonstop", "serve", "--backend", "reference", "--port", str(port), "--no-warmup"]
    with launched(argv) as proc:
        end = time.monotonic() + 120
        wait_until_up(url, proc, end)
        client, reply = long_request(url, 2000, end)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        client.join(30)
    assert proc.returncode == 0, err  # as uvicorn.run: Ctrl-C is a clean stop
    assert "Traceback" not in err and "CancelledError" not in err, err
    if reply.get("status") != 200:  # it did not finish within the grace period
        assert reply.get("status") == 503, reply  # unavailable, not an internal error: retry elsewhere
        assert "shutting down" in json.loads(reply["body"])["error"]["message"], reply


def _stopped_under_a_request(model_dir, stream: bool) -> httpx.Response:
    """Stop the engine (as serve does after its grace period) under a long greedy request; its reply."""
    from nonstop.engine.llm import LLM
    from nonstop.server import build_context
    from tests.server.conftest import MODEL_NAME
    from tests.server.in_flight import active
    from tests.server.inprocess import serve_in_thread

    llm = LLM(model_dir, dtype="float32", max_batch=2)
    ctx = build_context(llm, [MODEL_NAME], max_batch=2)
    longest = llm.cfg.max_position_embeddings - 8  # as long as the context allows: still running when stopped
    body = {"model": MODEL_NAME, "prompt": "The", "max_tokens": longest, "ignore_eos": True}
    with serve_in_thread(ctx) as url:
        reply = {}
        ask = threading.Thread(
            target=lambda: reply.update(
                r=httpx.post(url + "/v1/completions", json={**body, "stream": stream, "temperature": 0}, timeout=120)
            )
        )
        ask.start()
        deadline = time.monotonic() + 60
        while not active(url):
            assert time.monotonic() < deadline and ask.is_alive(), "the request never started"
            time.sleep(0.02)
        ctx.engine.stop()
        ask.join(60)
    return reply["r"]


def test_a_request_ended_by_the_shutdown_is_a_503_whole_or_streamed(model_dir):
    """Ended because the server stops, a request is unavailable (503, retry elsewhere), not an internal error:
    whole, the status says so; streamed (its 200 already sent), the error event does."""
    whole = _stopped_under_a_request(model_dir, stream=False)
    assert whole.status_code == 503, whole.text
    assert whole.json()["error"]["code"] == "server_shutting_down"
    streamed = _stopped_under_a_request(model_dir, stream=True)
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert streamed.status_code == 200 and events[-1]["error"]["code"] == "server_shutting_down", events[-1]
