"""EngineLoop: a background thread that owns an ``EngineCore`` and serves many callers.

Callers ``submit`` a request with a sink (a callable); the thread admits waiting requests into free
slots between steps, runs ``core.step()`` and hands each request's new text and tokens to its sink
as a ``StreamEvent`` (the last one has ``finish_reason`` set). ``cancel`` ends a request at the next
step boundary and frees its slot. The waiting queue is bounded: ``submit`` raises
``EngineOverloaded`` when it is full. Sinks run on the engine thread and must return quickly (the
server's sink only hands the event to its event loop).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from nonstop.engine.core import EngineCore
from nonstop.engine.requests import Request

log = logging.getLogger("nonstop.engine")


class EngineOverloaded(RuntimeError):
    """The waiting queue is full; try again later."""


class EngineStopped(RuntimeError):
    """The loop is not running (not started, shutting down, or dead after an internal error)."""


@dataclass
class StreamEvent:
    """New output of one request since its previous event.

    text: newly visible text; token_ids: new generated ids; logprobs: their {token_id: logprob} rows
    (when asked); finish_reason: None while running, else stop | length | abort | error (``error`` says
    why); request: the request itself (counts, timings, prompt logprobs).
    """

    request: Request
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


Sink = Callable[[StreamEvent], None]


class EngineLoop:
    """Continuous batching over ``core``: at most ``max_waiting`` requests wait for a slot."""

    def __init__(self, core: EngineCore, max_waiting: int = 256):
        self.core = core
        self.max_waiting = max_waiting
        self._cond = threading.Condition()
        self._waiting: collections.deque[tuple[Request, Sink]] = collections.deque()
        self._cancelled: set[str] = set()
        self._sinks: dict[str, tuple[Request, Sink, int]] = {}  # admitted: id -> (request, sink, tokens sent)
        self._admitting = 0  # taken off the queue for a free slot, not admitted yet (their slots still look free)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.fatal_error: str | None = None
        self.steps = 0

    # ------------------------------------------------------------------ caller side (any thread)
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    @property
    def shutting_down(self) -> bool:
        """``stop`` was called (the loop is ending by request, not after a fatal error)."""
        return self._stopping and self.fatal_error is None

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_active(self) -> int:
        """Requests holding a cache slot."""
        return len(self.core.prefilling) + len(self.core.running)

    @property
    def num_slots(self) -> int:
        """Requests that can hold a cache slot at once (``--max-batch``)."""
        return self.core.cache.num_slots

    def start(self) -> EngineLoop:
        self._thread = threading.Thread(target=self._run, name="nonstop-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread; requests still waiting or running end with an ``error`` event."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, req: Request, sink: Sink) -> None:
        """Queue ``req``; its events go to ``sink``. Raises EngineOverloaded when ``max_waiting`` requests already
        wait for a slot: those queued that the free slots take at the next step boundary do not (the queue is
        only read between steps, so a burst on an idle engine is all queued first), EngineStopped."""
        with self._cond:
            if not self.running:
                raise EngineStopped(self.fatal_error or "the engine is not running")
            unclaimed = max(0, len(self.core.free_slots) - self._admitting)
            waiting = len(self._waiting) - unclaimed
            if waiting >= self.max_waiting:
                raise EngineOverloaded(
                    f"{waiting} requests are already waiting for a slot (limit {self.max_waiting}); retry later"
                )
            self._waiting.append((req, sink))
            self._cond.notify()

    def cancel(self, request_id: str) -> None:
        """End a request (client gone); its slot is freed at the next step boundary."""
        with self._cond:
            self._cancelled.add(request_id)
            self._cond.notify()

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        while True:
            try:
                if not self._iterate():
                    break
            except Exception as exc:  # not one request's fault (those are isolated in the core)
                log.exception("engine iteration failed; ending the requests in flight")
                try:
                    self._end_active(f"engine failure: {type(exc).__name__}: {exc}")
                except Exception as again:  # cannot even clean up: refuse new work
                    log.exception("engine loop died")
                    self.fatal_error = f"engine loop died: {type(again).__name__}: {again}"
                    self._stopping = True
                    break
        self._end_all(self.fatal_error or "the server is shutting down")

    def _iterate(self) -> bool:
        """One admission + step round; False when the loop should end."""
        with self._cond:
            while not (self._stopping or self._waiting or self._cancelled or self.core.active):
                self._cond.wait()
            if self._stopping:
                return False
            cancelled, self._cancelled = self._cancelled, set()
            self._drop_waiting(cancelled)
            admitted = []
            while self._waiting and len(admitted) < len(self.core.free_slots):
                req, sink = self._waiting.popleft()
                self._sinks[req.request_id] = (req, sink, 0)
                admitted.append(req)
            self._admitting = len(admitted)
        for req in admitted:
            self._admit(req)
            with self._cond:
                self._admitting -= 1
        for req in list(self.core.active):
            if req.request_id in cancelled:
                self.core.abort(req, "abort")
                self._send(req, "")
        if self.core.active:
            produced = []
            try:
                self.core.step(produced)
            finally:  # a step that fails part-way still delivers what it produced before the failure
                for req, text in produced:
                    self._send(req, text)
            self.steps += 1
        return True

    def _drop_waiting(self, cancelled: set[str]) -> None:
        """Remove cancelled requests from the waiting queue (lock held) and tell their sinks."""
        if not cancelled:
            return
        keep = collections.deque()
        for req, sink in self._waiting:
            if req.request_id in cancelled:
                req.stop("abort")
                _safe_call(sink, StreamEvent(req, "", [], None, "abort"))
            else:
                keep.append((req, sink))
        self._waiting = keep

    def _admit(self, req: Request) -> None:
        try:
            self.core.admit(req)
        except Exception as exc:
            req.stop("error", str(exc))
            self._send(req, "")

    def _send(self, req: Request, text: str) -> None:
        if req.request_id not in self._sinks:
            return
        _, sink, sent = self._sinks[req.request_id]
        n = len(req.output_ids)
        logprobs = req.logprobs[sent:n] if req.logprobs is not None else None
        event = StreamEvent(req, text, req.output_ids[sent:n], logprobs, req.finish_reason, req.error)
        if req.finished:
            del self._sinks[req.request_id]
        else:
            self._sinks[req.request_id] = (req, sink, n)
        if not _safe_call(sink, event) and not req.finished:
            self.core.abort(req, "abort")
            self._sinks.pop(req.request_id, None)

    def _end_all(self, message: str) -> None:
        with self._cond:
            waiting, self._waiting = list(self._waiting), collections.deque()
        for req, sink in waiting:
            req.stop("error", message)
            _safe_call(sink, StreamEvent(req, "", [], None, "error", message))
        self._end_active(message)

    def _end_active(self, message: str) -> None:
        """End every admitted request with an ``error`` event and free its slot."""
        for req, _, _ in list(self._sinks.values()):
            self.core.abort(req, "error", message)
            self._send(req, "")


def _safe_call(sink: Sink, event: StreamEvent) -> bool:
    """Deliver an event; False if the sink failed (its caller is gone)."""
    try:
        sink(event)
        return True
    except Exception:
        log.exception("dropping request %s: its sink failed", event.request.request_id)
        return False
