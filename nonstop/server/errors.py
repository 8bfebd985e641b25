"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with a fitting status.

Handlers turn every failure into that body: our own ``APIError``, malformed JSON and failed
validation (400), unknown routes (404), and anything unexpected (500, logged here with its
traceback; the client only sees a one-line message).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("nonstop.server")

ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error", 500: "internal_error", 503: "service_unavailable"}


class APIError(Exception):
    """An error for the client: HTTP ``status`` and the OpenAI error fields."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ERROR_TYPES.get(status, "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


def _validation_error(exc: RequestValidationError) -> APIError:
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    return bad_request(f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid value')}", ".".join(loc) or None)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        return APIError(exc.status_code, message).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return APIError(500, f"internal error: {type(exc).__name__}").response()
