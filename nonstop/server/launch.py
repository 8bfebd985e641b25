"""Wire an ``LLM`` into a serving context and run the app with uvicorn."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time

from nonstop.engine.llm import LLM
from nonstop.engine.loop import EngineLoop
from nonstop.server.app import ServingContext, create_app
from nonstop.server.translate import Limits


def build_context(
    llm: LLM,
    served_names: list[str],
    max_batch: int = 16,
    max_waiting: int = 256,
    max_model_len: int | None = None,
    max_prompts: int = 16,
    max_body_bytes: int = 1 << 20,
    api_key: str | None = None,
    default_max_tokens: int | None = None,
) -> ServingContext:
    """An engine loop with ``max_batch`` slots (errors isolated per request; prefill chunk and batch
    invariance as ``llm`` was made with) and the server's limits. default_max_tokens: for requests
    without max_tokens (None: the checkpoint's generation_config.json ``max_new_tokens``, if any)."""
    context = llm.cfg.max_position_embeddings
    max_len = min(max_model_len or context, context)
    core = llm.new_core(max_batch, isolate_errors=True, max_len=max_len)
    engine = EngineLoop(core, max_waiting=max_waiting)
    default = default_max_tokens or llm.generation.defaults.get("max_tokens")
    limits = Limits(max_len=max_len, max_prompts=max_prompts, max_body_bytes=max_body_bytes, default_max_tokens=default)
    return ServingContext(llm=llm, engine=engine, served_names=served_names, limits=limits, api_key=api_key)


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (not yet listening), made before the model loads so that an
    address in use, or a host this machine does not have, is one clear ValueError at once rather than
    uvicorn's failure after the load. ``serve`` listens on it."""
    if not host.strip():
        raise ValueError("--host is empty: give an address to listen on (0.0.0.0 for every interface)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses the port at once
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


GRACE_S = 5.0  # after a stop signal, requests still running this much later end with an error


def _server(config, engine, repeat_s: float):
    """A uvicorn server whose stop signal, ``GRACE_S`` later, also ends the requests still running
    (``EngineLoop.stop``: each ends with a clean error, "the server is shutting down"), so that their
    handlers answer and uvicorn never cancels them (a traceback and a bare 500 each). A stop signal
    repeated within ``repeat_s`` is the same one: under a launcher a terminal's Ctrl-C reaches rank 0 both
    directly and relayed, and uvicorn takes a second SIGINT for "force quit"."""
    import uvicorn

    class Server(uvicorn.Server):
        timer: threading.Timer | None = None
        last = float("-inf")

        def handle_exit(self, sig, frame) -> None:
            now = time.monotonic()
            if now - self.last < repeat_s:
                return
            self.last = now
            super().handle_exit(sig, frame)
            if self.timer is None:
                self.timer = threading.Timer(GRACE_S, engine.stop)
                self.timer.daemon = True
                self.timer.start()

    return Server(config)


def _terminated(signum, frame) -> None:
    raise SystemExit(128 + signum)


def serve(
    ctx: ServingContext,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    sock: socket.socket | None = None,
) -> None:
    """Run the server until interrupted (the engine thread starts and stops with the app), on ``sock``
    (``bind_socket``'s) when given, else binding ``host``:``port`` itself. SIGINT or SIGTERM: requests in
    flight get ``GRACE_S`` to finish, then end with an error; Ctrl-C returns, SIGTERM exits 143 (``atexit``
    hooks run: under a layout rank 0 tells the other ranks to stop)."""
    import uvicorn

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = uvicorn.Config(
        create_app(ctx), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=GRACE_S + 5
    )
    server = _server(config, ctx.engine, 1.0 if "RANK" in os.environ else 0.0)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main else None  # uvicorn re-raises it at the end
    try:
        server.run(sockets=[sock] if sock is not None else None)
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it shut down on (as uvicorn.run, a clean stop)
        pass
    finally:
        if server.timer is not None:
            server.timer.cancel()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if not server.started:
        raise ValueError(f"the server could not start on {host}:{port} (see the log above)")
