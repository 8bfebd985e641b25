"""The OpenAI-compatible HTTP app: /v1/completions, /v1/chat/completions (whole or streamed as
server-sent events), /v1/models, /v1/models/{id}, /health and /metrics, over one ``EngineLoop``.

Streams end with ``data: [DONE]``; with ``stream_options.include_usage`` a last chunk carries the
usage and the others ``"usage": null``, as OpenAI's (with ``continuous_usage_stats`` the usage so far).
A client that disconnects (mid-stream, or while waiting for a whole response) has its requests cancelled
so their slots free at once; one that leaves while sending its body is counted as 499, as they are. A
request that fails inside the engine gets an error body (or an ``error`` event mid-stream); the server
keeps serving.

Request bodies are read with a size limit, then parsed, validated, tokenized and rendered in a worker
thread, and a whole response is built and rendered in one, so neither a large prompt nor a large response
(echo, n, top logprobs) stalls the event loop (``/health`` and running streams stay live); while
serving, the heap alive at startup is frozen out of the garbage collector, whose full collections
would otherwise stop the loop for a time that grows with it (``freeze_startup_heap``).
With an API key every ``/v1`` route wants ``Authorization: Bearer <key>``. ``/openapi.json`` carries
the request schemas of both POST endpoints.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

import nonstop
from nonstop.engine.llm import LLM
from nonstop.engine.loop import EngineLoop
from nonstop.server.errors import APIError, install_error_handlers, internal_error
from nonstop.server.metrics import TEXT_CONTENT_TYPE, ServerMetrics
from nonstop.server.protocol import ChatCompletionBody, CompletionBody
from nonstop.server.responses import Choice, ResponseBuilder, TextOffsets, sse, usage
from nonstop.server.submission import RETRY_AFTER_S, Submission
from nonstop.server.translate import (
    Limits,
    chat_requests,
    check_model,
    completion_requests,
    echo_only,
    new_id,
    parse_body,
)

log = logging.getLogger("nonstop.server")


@dataclass
class ServingContext:
    """What the routes need: the model (tokenizer, request factory), the engine loop, limits, metrics."""

    llm: LLM
    engine: EngineLoop
    served_names: list[str]
    limits: Limits
    api_key: str | None = None
    metrics: ServerMetrics = field(init=False)
    started: float = field(default_factory=time.time)

    def __post_init__(self):
        self.metrics = ServerMetrics(active=lambda: self.engine.num_active, waiting=lambda: self.engine.num_waiting)


ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/openapi.json")


def route_label(path: str) -> str:
    """The endpoint a path counts under in /metrics (unknown paths: ``other``)."""
    if path in ROUTES:
        return path
    return "/v1/models/{model}" if path.startswith("/v1/models/") else "other"


class ErrorBoundary:
    """Pure ASGI middleware (streaming and disconnect detection pass through untouched): counts every
    response by route and status, and turns an exception nothing handled into a complete 500 response
    with an OpenAI error body, so it is counted and the keep-alive connection stays usable. If the
    response had already started there is nothing valid left to send: the exception goes on and the
    server closes the connection."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def counting_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.count_request(route_label(scope["path"]), message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception as exc:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            await internal_error(exc).response()(scope, receive, counting_send)


BODY_POLL_S = 0.25  # while a body arrives, how often ``read_body`` looks whether the server stopped


async def read_body(request: Request, limit: int, stopped=None) -> bytes:
    """The request body, refused with 413 (and ``Connection: close``, as the rest is left unread) as soon
    as it exceeds ``limit`` bytes. A client that leaves before sending all of it gets the 499 of every
    client that leaves (counted, not logged as an error). ``stopped()``: whether the server has stopped
    (the engine, ``launch.GRACE_S`` after a stop signal); a body still arriving then is answered with a 503
    (and ``Connection: close``) rather than left for uvicorn to cancel (a traceback and a bare 500)."""
    too_large = APIError(
        413,
        f"request body exceeds the limit of {limit} bytes",
        code="request_too_large",
        headers={"Connection": "close"},
    )
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    stream = request.stream().__aiter__()
    try:
        while True:
            chunk = await _next_chunk(stream, stopped)
            if chunk is None:
                break
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:
        raise APIError(499, "the client disconnected while sending the body", code="client_disconnected") from None
    return b"".join(chunks)


async def _next_chunk(stream, stopped) -> bytes | None:
    """The body's next chunk (None at its end), or a 503 once ``stopped()`` while waiting for it."""
    pending = asyncio.ensure_future(stream.__anext__())
    while stopped is not None:
        done, _ = await asyncio.wait({pending}, timeout=BODY_POLL_S)
        if done:
            break
        if stopped():
            pending.cancel()
            raise APIError(
                503,
                "the server is shutting down: the request body did not arrive in time",
                code="server_shutting_down",
                headers={"Connection": "close"},
            )
    try:
        return await pending
    except StopAsyncIteration:
        return None


def _api_key_check(ctx: ServingContext):
    async def require_api_key(request: Request) -> None:
        if ctx.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip().encode("utf-8", "replace")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, ctx.api_key.encode("utf-8")):
            raise APIError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return require_api_key


def freeze_startup_heap() -> None:
    """Move every object alive now (the model, the imported modules: millions in a large process) out of
    the collector's reach until ``gc.unfreeze()``. A full collection stops every thread, the event loop
    included, for time proportional to the objects it walks: 0.67 s for a 6.4M-object heap on this
    project's CPU machine, 2 ms once frozen (``/health`` answered in 0.69 s against 0.045 s). Requests'
    own objects are still collected; the startup heap lives as long as the server anyway."""
    gc.collect()
    gc.freeze()


def create_app(ctx: ServingContext, manage_engine: bool = True) -> FastAPI:
    """The app; with ``manage_engine`` it starts the engine loop on startup and stops it on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_engine and not ctx.engine.running:
            ctx.engine.start()
        freeze_startup_heap()
        yield
        gc.unfreeze()
        if manage_engine:
            ctx.engine.stop()

    app = FastAPI(title="nonstop", version=nonstop.__version__, lifespan=lifespan)
    app.state.ctx = ctx
    install_error_handlers(app)
    app.add_middleware(ErrorBoundary, metrics=ctx.metrics)
    auth = [Depends(_api_key_check(ctx))]
    limits = ctx.limits

    # HEAD answers as GET does, outside the OpenAPI schema (one route for both gave two operations one id)
    @app.head("/health", include_in_schema=False)
    @app.get("/health")
    async def health():
        if not ctx.engine.running:
            raise APIError(
                503,
                ctx.engine.fatal_error or "engine not running",
                code="engine_unavailable",
                headers={"Retry-After": "5"},
            )
        return {"status": "ok", "active_sequences": ctx.engine.num_active, "queue_depth": ctx.engine.num_waiting}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(ctx.metrics.render(), media_type=TEXT_CONTENT_TYPE)

    def model_card(name: str) -> dict:
        return {
            "id": name,
            "object": "model",
            "created": int(ctx.started),
            "owned_by": "nonstop",
            "max_model_len": limits.max_len,
        }

    @app.get("/v1/models", dependencies=auth)
    async def models():
        return {"object": "list", "data": [model_card(name) for name in ctx.served_names]}

    @app.get("/v1/models/{model_id:path}", dependencies=auth)
    async def model(model_id: str):
        check_model(model_id, ctx.served_names)
        return model_card(model_id)

    @app.post("/v1/completions", dependencies=auth)
    async def completions(request: Request):
        raw = await read_body(request, limits.max_body_bytes, lambda: ctx.engine.shutting_down)
        call_id = new_id("cmpl")

        def prepare():
            body = parse_body(raw, CompletionBody, limits)
            check_model(body.model, ctx.served_names)
            return body, *completion_requests(body, ctx.llm, limits, call_id)

        body, requests, echoes = await run_in_threadpool(prepare)
        builder = ResponseBuilder("completion", body.model, ctx.llm.tokenizer, body.logprobs, call_id)
        keep = not echo_only(body)
        return await _respond(ctx, request, requests, builder, body, echoes if body.echo else None, keep)

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat_completions(request: Request):
        raw = await read_body(request, limits.max_body_bytes, lambda: ctx.engine.shutting_down)
        call_id = new_id("chatcmpl")

        def prepare():
            body = parse_body(raw, ChatCompletionBody, limits)
            check_model(body.model, ctx.served_names)
            return body, chat_requests(body, ctx.llm, limits, call_id)

        body, requests = await run_in_threadpool(prepare)
        top = (body.top_logprobs or 0) if body.logprobs else None
        builder = ResponseBuilder("chat", body.model, ctx.llm.tokenizer, top, call_id)
        return await _respond(ctx, request, requests, builder, body, None)

    app.openapi = lambda: _openapi_with_request_schemas(app)
    return app


def _openapi_with_request_schemas(app: FastAPI) -> dict:
    """FastAPI's document plus the JSON schemas of the two request bodies (the routes read raw bytes, so
    FastAPI cannot see them), for API clients and fuzzers."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        routes=app.routes,
        description="OpenAI-compatible completions and chat completions (nonstop).",
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, body in (("/v1/completions", CompletionBody), ("/v1/chat/completions", ChatCompletionBody)):
        js = body.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(js.pop("$defs", {}))
        components[body.__name__] = js
        schema["paths"][path]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{body.__name__}"}}},
        }
    app.openapi_schema = schema
    return schema


def _usage_mode(body) -> str | None:
    """``stream_options``: None (no usage chunk), ``last`` (include_usage: a last chunk carries it) or
    ``every`` (and continuous_usage_stats: every chunk carries the usage so far, as vLLM does)."""
    opts = body.stream_options
    if not (opts and opts.include_usage):
        return None
    return "every" if opts.continuous_usage_stats else "last"


def _choices(count: int, n: int, keep_output: bool = True) -> list[Choice]:
    """One Choice per request; the prompt's tokens count once per prompt (choice i·n of its n)."""
    return [Choice(i, counts_prompt=i % n == 0, keep_output=keep_output) for i in range(count)]


async def _respond(
    ctx: ServingContext,
    http: Request,
    requests,
    builder: ResponseBuilder,
    body,
    echoes: list[str] | None,
    keep_output: bool = True,
) -> Response:
    submission = Submission(ctx.engine, ctx.metrics, requests)
    submission.start()
    choices = _choices(len(requests), body.n, keep_output)
    if body.stream:
        # the background task also cancels when the client leaves before the stream's first chunk
        stream = _stream(submission, builder, choices, _usage_mode(body), echoes)
        return StreamingResponse(
            stream,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
            background=BackgroundTask(submission.cancel),
        )
    try:
        async for index, event in submission.events(http.is_disconnected):
            choices[index].add(event)
    finally:
        submission.cancel()
    if any(c.finish_reason is None for c in choices):  # the client went away
        return Response(status_code=499)
    failed = next((c for c in choices if c.finish_reason in ("error", "abort")), None)
    if failed:
        raise _generation_failed(ctx.engine, failed.error)
    # a large body (n x echoed prompt x top logprobs: megabytes) is built and rendered off the event loop
    return await run_in_threadpool(lambda: JSONResponse(builder.body(choices, echoes)))


def _generation_failed(engine: EngineLoop, error: str | None) -> APIError:
    """A request the engine ended early: 503 while the server shuts down (the client may retry elsewhere),
    else 500."""
    if engine.shutting_down:
        return APIError(
            503,
            f"generation stopped: {error or 'the server is shutting down'}",
            code="server_shutting_down",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return APIError(500, f"generation failed: {error or 'request aborted'}", code="generation_failed")


async def _stream(
    submission: Submission,
    builder: ResponseBuilder,
    choices: list[Choice],
    usage_mode: str | None,
    echoes: list[str] | None,
):
    """SSE chunks for one call; cancels its unfinished requests however the stream ends. An unexpected
    error mid-stream ends it with an ``error`` event (the status line is already sent). An echoed prompt
    goes first; with logprobs it waits for the prompt's logprobs, which come with the first token.
    With a usage mode every chunk has a ``usage`` key: null (as OpenAI sends) or, with ``every``, the
    usage so far once the engine has reported."""
    echo_with_logprobs = bool(echoes) and builder.top_logprobs is not None
    echo_pending = set(range(len(choices))) if echo_with_logprobs else set()
    # where each choice's next token starts in its whole text, counted as the whole response counts it
    # (every token's text, held back behind a possible stop string or not)
    offsets = [TextOffsets(builder.tokenizer, len(echoes[c.index]) if echoes else 0) for c in choices]

    def send(chunk: dict, counted: bool = True) -> str:
        if usage_mode:
            chunk["usage"] = usage(choices) if usage_mode == "every" and counted else None
        return sse(chunk)

    try:
        for c in choices:
            if builder.kind == "chat":
                yield send(builder.role_chunk(c.index), counted=False)
            elif echoes and not echo_with_logprobs:
                fields = {"index": c.index, "text": echoes[c.index], "logprobs": None, "finish_reason": None}
                yield send(builder.chunk([fields]), counted=False)
        async for index, event in submission.events():
            event = choices[index].add(event)
            if event.finish_reason in ("error", "abort"):
                yield sse(_generation_failed(submission.engine, event.error).body())
                submission.cancel()
                break
            echo = echoes[index] if index in echo_pending else None
            echo_pending.discard(index)
            chunk = builder.delta_chunk(index, event, offsets[index], echo, choices[index])
            if chunk is not None:
                yield send(chunk)
        else:
            if usage_mode:
                yield sse(builder.chunk([], usage(choices)))
        yield sse("[DONE]")
    except Exception as exc:
        log.exception("stream failed")
        yield sse(internal_error(exc).body())
        yield sse("[DONE]")
    finally:
        submission.cancel()
