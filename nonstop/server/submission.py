"""One HTTP call's requests in the engine, and the asyncio queue their events arrive on.

The engine thread calls each request's sink; the sink records metrics for a finished request and
hands the event to the event loop with ``call_soon_threadsafe``. ``events`` yields (choice index,
event) until every request has finished; whoever stops listening early calls ``cancel`` so the
engine frees the slots (``events`` does too when its iteration ends early: cancelled, closed, failed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from nonstop.engine.loop import EngineLoop, EngineOverloaded, EngineStopped, StreamEvent
from nonstop.engine.requests import Request
from nonstop.server.errors import APIError
from nonstop.server.metrics import ServerMetrics

DISCONNECT_POLL_S = 0.25
RETRY_AFTER_S = 1  # what a 429 / 503 asks the client to wait before retrying


class Submission:
    def __init__(self, engine: EngineLoop, metrics: ServerMetrics, requests: list[Request]):
        self.engine = engine
        self.metrics = metrics
        self.requests = requests
        self.queue: asyncio.Queue[tuple[int, StreamEvent]] = asyncio.Queue()
        self.unfinished = {r.request_id for r in requests}
        self._submitted: list[Request] = []
        self._refused = False  # refused part way (the client is told 429 / 503): what it queued ends unrecorded

    def start(self) -> None:
        """Submit every request; on overload cancel those already queued and raise 429 (503 if stopped)."""
        loop = asyncio.get_running_loop()
        held = self.engine.num_slots + self.engine.max_waiting
        if len(self.requests) > held:  # a 429 would never clear: say so
            raise APIError(
                400,
                f"this call asks for {len(self.requests)} completions (prompts x n) but the server holds at most "
                f"{held} at once ({self.engine.num_slots} in slots, --max-batch, and {self.engine.max_waiting} "
                "waiting, --max-waiting): send fewer at once",
                param="n",
                code="too_many_completions",
            )
        try:
            for index, req in enumerate(self.requests):
                self.engine.submit(req, self._sink(loop, index))
                self._submitted.append(req)
        except (EngineOverloaded, EngineStopped) as exc:
            self._refused = True
            self.cancel()
            if isinstance(exc, EngineOverloaded):
                raise APIError(
                    429, f"server overloaded: {exc}", code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)}
                ) from None
            raise APIError(
                503,
                f"server unavailable: {exc}",
                code="engine_unavailable",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None

    def _sink(self, loop: asyncio.AbstractEventLoop, index: int) -> Callable[[StreamEvent], None]:
        def sink(event: StreamEvent) -> None:
            if event.finished and not self._refused:
                req = event.request
                self.metrics.record_finished(
                    event.finish_reason, len(req.prompt_ids), len(req.output_ids), req.output().metrics
                )
            loop.call_soon_threadsafe(self.queue.put_nowait, (index, event))

        return sink

    async def events(
        self, is_disconnected: Callable[[], Awaitable[bool]] | None = None
    ) -> AsyncIterator[tuple[int, StreamEvent]]:
        """(choice index, event) until all requests end. With ``is_disconnected`` the client is polled
        while waiting, and a gone client cancels the requests and ends the iteration. However else the
        iteration ends early - its task cancelled (uvicorn past its shutdown grace, a stream's client
        gone), closed, an error - the unfinished requests are cancelled: their slots are freed."""
        loop = asyncio.get_running_loop()
        next_check = loop.time() + DISCONNECT_POLL_S
        try:
            while self.unfinished:
                if is_disconnected is None:
                    index, event = await self.queue.get()
                else:
                    try:
                        index, event = await asyncio.wait_for(self.queue.get(), max(0.0, next_check - loop.time()))
                    except TimeoutError:
                        index = event = None
                    if loop.time() >= next_check:
                        next_check = loop.time() + DISCONNECT_POLL_S
                        if await is_disconnected():
                            return
                    if event is None:
                        continue
                if event.finished:
                    self.unfinished.discard(event.request.request_id)
                yield index, event
        finally:
            if self.unfinished:
                self.cancel()

    def cancel(self) -> None:
        """Ask the engine to end every request of this call that has not finished."""
        for req in self._submitted:
            if req.request_id in self.unfinished:
                self.engine.cancel(req.request_id)
