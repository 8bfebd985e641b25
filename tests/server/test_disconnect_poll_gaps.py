"""``Submission.events`` keeps polling a client that is still there: a client that leaves after the first
poll is noticed within a poll interval or two (not a minute later), and its unfinished requests are
cancelled in the engine."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from nonstop.server import submission
from nonstop.server.submission import Submission
from tests.server.in_flight import SilentEngine


def test_a_client_leaving_after_the_first_poll_is_noticed_at_the_next_polls(monkeypatch):
    """The client is still connected at the first two polls and gone at the third: the iteration ends
    about three poll intervals in (a next-poll time computed from anything but the poll interval would
    wait far longer), having polled exactly three times, and both unfinished requests are cancelled."""
    monkeypatch.setattr(submission, "DISCONNECT_POLL_S", 0.02)
    engine = SilentEngine()
    polls: list[float] = []

    async def is_disconnected() -> bool:
        polls.append(time.monotonic())
        return len(polls) >= 3

    async def run() -> list:
        sub = Submission(engine, None, [SimpleNamespace(request_id="a"), SimpleNamespace(request_id="b")])
        sub.start()
        return [event async for event in sub.events(is_disconnected)]

    t0 = time.monotonic()
    events = asyncio.run(asyncio.wait_for(run(), 10))
    elapsed = time.monotonic() - t0
    assert events == []
    assert len(polls) == 3
    assert elapsed < 2.0, f"the gone client was noticed only after {elapsed:.1f}s"
    assert sorted(engine.cancelled) == ["a", "b"]
