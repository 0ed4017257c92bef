"""The optional TCP listener for Prometheus: GET /metrics and nothing else.

Off unless ``[metrics] listen = "host:port"`` is set; it binds to exactly that
address (``127.0.0.1:9478`` is the documented choice: loopback, so a scraper on
the node or a port forward reaches it and nobody else). It serves no API: every
other path is a 404 JSON error, any other method a 405, in the API's error shape.

Anyone on the node can connect, so it bounds what a connection may cost: at most
``METRICS_LIMITS`` connections at once (more are closed at once, ``admission``), and
one idle for ``IDLE_SECONDS`` is closed, whether it never sent a request (aiohttp's
keep-alive timer runs from the connection's start: it also bounds how long a request
line and headers may take, against clients that send them a byte at a time) or sits
between scrapes (Prometheus opens a new one for the next).
"""

from __future__ import annotations

import socket
from typing import Protocol

from aiohttp import web
from aiohttp.typedefs import Handler

from rdmad.api import admission, tcpsock
from rdmad.api.errors import json_error
from rdmad.api.metrics import CONTENT_TYPE, Metrics
from rdmad.api.tcpsock import ListenError, parse_listen

DEFAULT_LISTEN = "127.0.0.1:9478"
PATH = "/metrics"
IDLE_SECONDS = 5.0  # a scrape takes milliseconds; Prometheus scrapes every 15 s or more


class AsyncCloseable(Protocol):
    async def close(self) -> None: ...


class MetricsListener:
    """A running TCP listener; ``addresses`` are what it is bound to."""

    def __init__(
        self,
        runner: web.AppRunner,
        sockets: list[socket.socket],
        acceptors: list[admission.Acceptor],
    ) -> None:
        self._runner = runner
        self._sockets = sockets
        self.acceptors = acceptors

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [(str(s.getsockname()[0]), int(s.getsockname()[1])) for s in self._sockets]

    async def close(self) -> None:
        for acceptor in self.acceptors:
            await acceptor.close()
        for sock in self._sockets:
            sock.close()
        await self._runner.cleanup()


async def start_tcp_listener(
    metrics: Metrics,
    listen: str,
    *,
    idle: float = IDLE_SECONDS,
    limits: admission.Limits | None = None,  # None: METRICS_LIMITS fitted to the fd limit
    sockets: list[socket.socket] | None = None,  # bound already (tcpsock.bind; the daemon's)
) -> MetricsListener:
    """Serve ``metrics`` on ``listen`` (host:port), or on the ``sockets`` bound to it
    already, which it then owns (closed if it fails). Raises ListenError or OSError
    (address in use, not local) when it cannot listen; the caller decides to go on."""
    if sockets is None:
        parse_listen(listen)  # a bad value is refused before anything is set up

    async def scrape(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    # Scrapes carry no body: anything sent is refused at 1 KiB.
    app = web.Application(middlewares=[_json_errors], client_max_size=1024)
    app.router.add_get(PATH, scrape)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=idle)
    held = list(sockets or [])
    try:
        await runner.setup()
        if sockets is None:
            held = await tcpsock.bind(listen)
        assert runner.server is not None  # set up
        fitted = limits or admission.fit(admission.METRICS_LIMITS, admission.fd_limit())
        slots = admission.Slots(fitted)  # one bound for every address it listens on
        acceptors = []
        for sock in held:
            acceptor = admission.Acceptor(sock, runner.server, slots, name="metrics")
            acceptor.start()
            acceptors.append(acceptor)
    except BaseException:
        tcpsock.close(held)
        await runner.cleanup()
        raise
    return MetricsListener(runner, held, acceptors)


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
