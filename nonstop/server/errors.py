"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with a fitting status.

Handlers turn every failure into that body: our own ``APIError``, malformed JSON and failed
validation (400), unknown routes (404), a wrong method (405, with ``Allow``). Anything unexpected
becomes a 500 in the app's ``ErrorBoundary`` middleware (``app.py``), logged with its traceback; the
client sees a one-line message. Bodies are ASCII JSON, so no string a client sent can break them.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("nonstop.server")

# OpenAI's ``type`` for each status: a wrong key (401) and a missing model or route (404) are
# ``invalid_request_error`` there too (their ``code`` says which), a failure of ours is ``server_error``.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class ASCIIJSONResponse(JSONResponse):
    """JSON with non-ASCII characters escaped: lone surrogates from a client cannot fail the encoding."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


class APIError(Exception):
    """An error for the client: HTTP ``status`` and the OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ERROR_TYPES.get(status, "invalid_request_error")
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return ASCIIJSONResponse(self.body(), status_code=self.status, headers=self.headers)


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
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return APIError(exc.status_code, message, headers=dict(exc.headers or {})).response()


def internal_error(exc: BaseException) -> APIError:
    return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")
