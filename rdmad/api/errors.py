"""Every error the API gives is JSON (docs/API.md), never a traceback.

``{"error": {"status": 400, "code": "bad-request", "message": "..."}}``. The
catch-all turns anything unforeseen into ``500 internal`` and logs it; aiohttp's
own errors (404, 405, 413 from ``client_max_size``) pass through the same
middleware and leave as JSON too. The limits middleware keeps the number of
requests in flight bounded: past it, ``503 unavailable`` at once rather than a
queue that grows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

log = structlog.get_logger("rdmad.api")

CODES = {
    400: "bad-request",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    408: "timeout",
    413: "too-large",
    503: "unavailable",
    500: "internal",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """Raised by handlers: becomes the JSON error with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    code = CODES.get(status, "bad-request" if status < 500 else "internal")
    body = {"error": {"status": status, "code": code, "message": message}}
    return web.json_response(body, status=status, headers=headers)


def _http_message(exc: web.HTTPException) -> str:
    if exc.status == 404:
        return "no such endpoint (see /usr/share/doc/rdmad/API.md: /v1/status, /v1/plan, ...)"
    if exc.status == 413:
        return "request body too large (limit 64 KiB)"
    return exc.reason


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return json_error(exc.status, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like are answers, not errors
        headers = {}
        if exc.status == 405:
            allow = exc.headers.get("Allow")
            if allow:
                headers["Allow"] = allow
        return json_error(exc.status, _http_message(exc), headers)
    except asyncio.CancelledError:
        raise  # the client went away (handler_cancellation) or the server is closing
    except Exception:
        log.exception("api.internal-error", method=request.method, path=request.path)
        return json_error(500, "internal error; the daemon's log has the details")


def limits(max_in_flight: int) -> Middleware:
    """At most ``max_in_flight`` requests handled at once; the rest get 503 at once."""
    state: dict[str, Any] = {"in_flight": 0}

    @web.middleware
    async def bounded(request: web.Request, handler: Handler) -> web.StreamResponse:
        if state["in_flight"] >= max_in_flight:
            return json_error(503, f"busy: {max_in_flight} requests in flight; try again")
        state["in_flight"] += 1
        try:
            return await handler(request)
        finally:
            state["in_flight"] -= 1

    return bounded
