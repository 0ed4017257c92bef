"""The optional TCP listener for Prometheus: GET /metrics and nothing else.

Off unless ``[metrics] listen = "host:port"`` is set; it binds to exactly that
address (``127.0.0.1:9478`` is the documented choice: loopback, so a scraper on
the node or a port forward reaches it and nobody else). It serves no API: every
other path is a 404 JSON error, any other method a 405, in the API's error shape.
"""

from __future__ import annotations

import ipaddress
from typing import Protocol

from aiohttp import web
from aiohttp.typedefs import Handler

from rdmad.api.errors import json_error
from rdmad.api.metrics import CONTENT_TYPE, Metrics

DEFAULT_LISTEN = "127.0.0.1:9478"
PATH = "/metrics"


class AsyncCloseable(Protocol):
    async def close(self) -> None: ...


class ListenError(ValueError):
    """A ``listen`` value that is not host:port."""


def parse_listen(value: str) -> tuple[str, int]:
    """``"127.0.0.1:9478"`` -> ("127.0.0.1", 9478); ``"[::1]:9478"`` -> ("::1", 9478).

    Port 0 asks the kernel for a free port (tests).
    """
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ListenError(f"listen: expected host:port or [v6-address]:port, got {value!r}")
    port = int(port_text)
    if port > 65535:
        raise ListenError(f"listen: port {port} is out of range (0-65535) in {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise ListenError(f"listen: {host!r} is not an IPv6 address in {value!r}") from exc
    elif ":" in host:
        raise ListenError(f"listen: write an IPv6 address in brackets: [{host}]:{port}")
    return host, port


class MetricsListener:
    """A running TCP listener; ``addresses`` are what it is bound to."""

    def __init__(self, runner: web.AppRunner) -> None:
        self._runner = runner

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [(str(a[0]), int(a[1])) for a in self._runner.addresses]

    async def close(self) -> None:
        await self._runner.cleanup()


async def start_tcp_listener(metrics: Metrics, listen: str) -> MetricsListener:
    """Serve ``metrics`` on ``listen`` (host:port). Raises ListenError or OSError
    (address in use, not local) when it cannot listen; the caller decides to go on."""
    host, port = parse_listen(listen)

    async def scrape(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    # Scrapes carry no body: anything sent is refused at 1 KiB.
    app = web.Application(middlewares=[_json_errors], client_max_size=1024)
    app.router.add_get(PATH, scrape)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return MetricsListener(runner)


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's HTTP errors (404, 405 ...) as the API's JSON error document."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = f"{request.method} {request.path}: {exc.reason}"
        if exc.status == 404:
            message += f"; this listener serves only GET {PATH}"
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return json_error(exc.status, message, headers)


__all__ = [
    "DEFAULT_LISTEN",
    "AsyncCloseable",
    "ListenError",
    "MetricsListener",
    "parse_listen",
    "start_tcp_listener",
]
