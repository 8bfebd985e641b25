"""The OpenAI-compatible HTTP app: /v1/completions, /v1/chat/completions (whole or streamed as
server-sent events), /v1/models, /health and /metrics, over one ``EngineLoop``.

Streams end with ``data: [DONE]``; with ``stream_options.include_usage`` a last chunk carries the
usage. A client that disconnects (mid-stream, or while waiting for a whole response) has its
requests cancelled so their slots free at once. A request that fails inside the engine gets an error
body (or an ``error`` event mid-stream); the server keeps serving.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from nonstop.engine.llm import LLM
from nonstop.engine.loop import EngineLoop
from nonstop.server.errors import APIError, install_error_handlers
from nonstop.server.metrics import TEXT_CONTENT_TYPE, ServerMetrics
from nonstop.server.protocol import ChatCompletionBody, CompletionBody
from nonstop.server.responses import Choice, ResponseBuilder, sse, usage
from nonstop.server.submission import Submission
from nonstop.server.translate import Limits, chat_request, check_model, completion_requests, new_id, parse_body


@dataclass
class ServingContext:
    """What the routes need: the model (tokenizer, request factory), the engine loop, limits, metrics."""

    llm: LLM
    engine: EngineLoop
    served_names: list[str]
    limits: Limits
    metrics: ServerMetrics = field(init=False)
    started: float = field(default_factory=time.time)

    def __post_init__(self):
        self.metrics = ServerMetrics(active=lambda: self.engine.num_active, waiting=lambda: self.engine.num_waiting)


ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")


class RequestCounter:
    """ASGI middleware counting HTTP responses by route and status (pure ASGI, so streaming and
    disconnect detection pass through untouched). Unknown paths count as ``other``."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.metrics.count_request(scope["path"] if scope["path"] in ROUTES else "other", message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)


def create_app(ctx: ServingContext, manage_engine: bool = True) -> FastAPI:
    """The app; with ``manage_engine`` it starts the engine loop on startup and stops it on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_engine and not ctx.engine.running:
            ctx.engine.start()
        yield
        if manage_engine:
            ctx.engine.stop()

    app = FastAPI(title="nonstop", lifespan=lifespan)
    app.state.ctx = ctx
    install_error_handlers(app)
    app.add_middleware(RequestCounter, metrics=ctx.metrics)

    @app.get("/health")
    async def health():
        if not ctx.engine.running:
            raise APIError(503, ctx.engine.fatal_error or "engine not running", code="engine_unavailable")
        return {"status": "ok", "active_sequences": ctx.engine.num_active, "queue_depth": ctx.engine.num_waiting}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(ctx.metrics.render(), media_type=TEXT_CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        data = [{"id": name, "object": "model", "created": int(ctx.started), "owned_by": "nonstop", "max_model_len": ctx.limits.max_len} for name in ctx.served_names]
        return {"object": "list", "data": data}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = parse_body(await request.body(), CompletionBody, ctx.limits)
        check_model(body.model, ctx.served_names)
        call_id = new_id("cmpl")
        requests, echoes = completion_requests(body, ctx.llm, ctx.limits, call_id)
        builder = ResponseBuilder("completion", body.model, ctx.llm.tokenizer, body.logprobs, call_id)
        return await _respond(ctx, request, requests, builder, body.stream, _include_usage(body), echoes if body.echo else None)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = parse_body(await request.body(), ChatCompletionBody, ctx.limits)
        check_model(body.model, ctx.served_names)
        call_id = new_id("chatcmpl")
        req = chat_request(body, ctx.llm, ctx.limits, call_id)
        top = (body.top_logprobs or 0) if body.logprobs else None
        builder = ResponseBuilder("chat", body.model, ctx.llm.tokenizer, top, call_id)
        return await _respond(ctx, request, [req], builder, body.stream, _include_usage(body), None)

    return app


def _include_usage(body) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


async def _respond(ctx: ServingContext, http: Request, requests, builder: ResponseBuilder, stream: bool, include_usage: bool, echoes: list[str] | None) -> Response:
    submission = Submission(ctx.engine, ctx.metrics, requests)
    submission.start()
    if stream:
        # the background task also cancels when the client leaves before the stream's first chunk
        return StreamingResponse(_stream(submission, builder, len(requests), include_usage, echoes), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}, background=BackgroundTask(submission.cancel))
    choices = [Choice(i) for i in range(len(requests))]
    try:
        async for index, event in submission.events(http.is_disconnected):
            choices[index].add(event)
    finally:
        submission.cancel()
    if any(c.finish_reason is None for c in choices):  # the client went away
        return Response(status_code=499)
    failed = next((c.error or "request aborted" for c in choices if c.finish_reason in ("error", "abort")), None)
    if failed:
        raise APIError(500, f"generation failed: {failed}", code="generation_failed")
    return JSONResponse(builder.body(choices, echoes))


async def _stream(submission: Submission, builder: ResponseBuilder, n: int, include_usage: bool, echoes: list[str] | None):
    """SSE chunks for one call; cancels its unfinished requests however the stream ends."""
    choices = [Choice(i) for i in range(n)]
    try:
        for i in range(n):
            if builder.kind == "chat":
                yield sse(builder.role_chunk(i))
            elif echoes:
                yield sse(builder.chunk([{"index": i, "text": echoes[i], "logprobs": None, "finish_reason": None}]))
        async for index, event in submission.events():
            offset = len(echoes[index]) if echoes else 0
            offset += len(choices[index].text)
            choices[index].add(event)
            if event.finish_reason in ("error", "abort"):
                yield sse(APIError(500, f"generation failed: {event.error or 'request aborted'}", code="generation_failed").body())
                submission.cancel()
                break
            chunk = builder.delta_chunk(index, event, offset)
            if chunk is not None:
                yield sse(chunk)
        else:
            if include_usage:
                yield sse(builder.chunk([], usage(choices)))
        yield sse("[DONE]")
    finally:
        submission.cancel()
