"""A uvicorn server running the app in a thread of the test process, for tests that reach inside
(inject a fault, slow a tokenizer). Free localhost port; stopped and joined on exit."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import httpx

from nonstop.dist.launch import free_port


@contextmanager
def serve_in_thread(ctx, timeout: float = 30.0):
    """Yield the base URL of a server for ``ctx`` (a ``ServingContext``); the engine starts and stops with it."""
    import uvicorn

    from nonstop.server import create_app

    port = free_port()
    config = uvicorn.Config(create_app(ctx), host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError("in-process server did not start")
        time.sleep(0.05)
    try:
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout)
