"""The local API and the metrics exporters, started once the first reconcile pass rests.

Importing aiohttp and prometheus_client is most of the daemon's start-up cost (a
quarter of a second on a normal host, seconds under emulation), and none of it is
needed to put a node right. So the daemon starts the agent at once and imports these
in a worker thread once the first pass has rested (READY=1), or ``SERVICES_WAIT`` after
the start if it has not by then; they start on the loop when the import is done. Not
beside the first pass: the import and the pass's Python share one GIL, and at boot, on
a contended or cold host, the import lengthened the restore (bench/NOTES.md, "the
services after the first rest": in the lab's reboots, the restore after the VFs appear
is 0.5-0.7 s shorter without it, READY=1 1.3-1.8 s sooner). The bound keeps the API
near when a pass waits long on the kernel (a large NIC's ``sriov_numvfs`` write takes
a minute, off the loop): rdmad-ctl then answers about where it stands.

Two promises survive the move:

* ``READY=1`` still means "the node was reconciled *and* rdmad-ctl can reach the
  daemon": the API socket is made (``rdmad.api.unixsock``: the standard library only,
  final owner and mode, listening) before the import starts, and ``ReadyGate`` holds the
  agent's READY=1 until then. A client that connects while aiohttp is still being
  imported waits in the socket's backlog and is answered when the server starts; its
  own timeout (rdmad-ctl's ``--timeout``) bounds the wait. If the services cannot
  start, the socket is removed: a client is then refused, never left waiting.
* Metrics count from the start: ``EarlyChanges`` listens to the status store from
  before the first pass and hands what it heard to ``Metrics`` when it exists.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec
import structlog

from rdmad import nossl
from rdmad.agent import Notifier
from rdmad.model import ApiSpec, Desired, MetricsSpec
from rdmad.status import Change, StatusView
from rdmad.triggers import TriggerQueue

if TYPE_CHECKING:
    from rdmad.api import ApiServer
    from rdmad.api.metrics import Metrics
    from rdmad.api.unixsock import Listening

log = structlog.get_logger("rdmad.daemon")

# The store's changes kept for Metrics until it exists: a first pass over a large node
# publishes a few hundred; past this the oldest go (counters then start a little low).
EARLY_CHANGES_MAX = 10_000
# How long the services may take to import and start before READY=1 goes out without
# them (the agent's own startup deadline is 30 s; a thread cannot be cancelled).
SERVICES_DEADLINE = 60.0
# How long the import waits for the first pass to rest (READY=1) before it starts
# anyway: past the lab's reboot restore under emulation (~3 s from the first log line),
# and short of rdmad-ctl's own 5 s timeout on a node that imports in a fraction of one.
SERVICES_WAIT = 3.0
NO_API = "running without the local API: rdmad-ctl cannot reach this daemon"


class ReadyGate:
    """A notifier that holds READY=1 until ``open()``; everything else goes through.

    Held until the API socket listens (or is known not to): a unit ordered after rdmad
    (or an operator right after ``systemctl start``) may call rdmad-ctl as soon as
    systemd says rdmad is up. The last READY message held is sent when the gate opens.
    ``rested`` is set at the agent's first READY=1, held or sent: the services' import
    waits for it.
    """

    def __init__(self, inner: Notifier) -> None:
        self.inner = inner
        self.is_open = False
        self.held: str | None = None
        self.rested = asyncio.Event()

    def notify(self, state: str) -> None:
        lines = state.split("\n")
        ready = "READY=1" in lines
        if ready:
            self.rested.set()
        if not self.is_open and ready:
            self.held = state
            rest = "\n".join(line for line in lines if line != "READY=1")
            if rest:
                self.inner.notify(rest)  # e.g. STATUS=: shown by systemctl at once
            return
        self.inner.notify(state)

    def open(self) -> None:
        if self.is_open:
            return
        self.is_open = True
        if self.held is not None:
            held, self.held = self.held, None
            self.inner.notify(held)


class EarlyChanges:
    """A status-store listener that keeps changes until Metrics takes them over."""

    def __init__(self, store: StatusView, limit: int = EARLY_CHANGES_MAX) -> None:
        self.store = store
        self.changes: deque[Change] = deque(maxlen=limit)
        store.subscribe(self)

    def __call__(self, change: Change) -> None:
        if change[0] != "plan":  # metrics count passes and history, never plans
            self.changes.append(change)

    def hand_over(self) -> list[Change]:
        """Stop listening; what was heard, oldest first."""
        self.store.unsubscribe(self)
        out = list(self.changes)
        self.changes.clear()
        return out


class _Closeable(Protocol):
    async def close(self) -> None: ...


class Services(msgspec.Struct):
    """What started beside the agent: each None/empty when off or failed."""

    metrics: Metrics | None = None
    api: ApiServer | None = None
    exporters: list[_Closeable] = msgspec.field(default_factory=list)

    async def close(self) -> None:
        if self.api is not None:
            await self.api.close()
        if self.metrics is not None:
            self.metrics.close()  # rdmad_up 0 in the textfile's last write
        for exporter in self.exporters:
            try:
                await exporter.close()
            except Exception:
                log.exception("metrics.close-failed", exporter=repr(exporter))


def import_services() -> float:
    """Import the API and metrics modules (in a worker thread); returns seconds taken."""
    started = time.monotonic()
    nossl.allow()  # prometheus_client imports ssl (rdmad.nossl)
    with no_ca_bundle():
        import rdmad.api.metrics  # prometheus_client
        import rdmad.api.server  # aiohttp  # noqa: F401

    return time.monotonic() - started


@contextmanager
def no_ca_bundle() -> Iterator[None]:
    """OpenSSL's default CA file is empty inside (``SSL_CERT_FILE``); as it was after.

    Importing aiohttp builds its HTTP client's two default SSL contexts, and OpenSSL
    parses the system's whole CA bundle for them: ~35 ms on a host, ~0.7 s of the
    import under emulation (bench/RESULTS.md). rdmad serves a UNIX socket and plain
    HTTP on loopback and never opens a TLS connection (its unit allows AF_UNIX and
    AF_NETLINK only), so nothing uses those contexts. Set for the import alone: a
    child started meanwhile (modprobe) inherits it, and uses no TLS either.
    """
    saved = os.environ.get("SSL_CERT_FILE")
    os.environ["SSL_CERT_FILE"] = os.devnull
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("SSL_CERT_FILE", None)
        else:
            os.environ["SSL_CERT_FILE"] = saved


async def start_services(
    location: Path,
    settings: Desired,
    store: StatusView,
    queue: TriggerQueue,
    early: EarlyChanges,
    gate: ReadyGate,
    *,
    importer: Callable[[], float] = import_services,
    wait: float = SERVICES_WAIT,
    deadline: float = SERVICES_DEADLINE,
    freeze: Callable[[], None] = gc.freeze,
) -> Services:
    """Make the API socket and the metrics listener's, and open the gate; once the
    first pass rests (at most ``wait`` s), import (off the loop), then start metrics,
    exporters and the API on those sockets.

    ``settings``: ``[api]`` and ``[metrics]`` as the daemon read them at start
    (``config.start_settings``), the ones its ``started_with`` holds.

    Never raises: the daemon's job is the node; a service that cannot start is logged.
    """
    services = Services()
    spec, metrics_spec = settings.api, settings.metrics
    listening = _listen(spec)
    scrape = await _bind_metrics(metrics_spec)
    gate.open()
    try:
        await _first_rest(gate, wait)
        seconds = await asyncio.wait_for(asyncio.to_thread(importer), deadline)
        from rdmad.api.metrics import Metrics

        services.metrics = Metrics(store, queue, earlier=early.hand_over())
        services.exporters = await _start_exporters(services.metrics, metrics_spec, scrape)
        scrape = None  # the listener's now (closed by it if it failed)
        services.api = await _start_api(location, spec, listening, store, queue, services.metrics)
        listening = None  # the server's now (it removed the socket if it failed)
        freeze()  # what the API's and metrics' imports made (daemon.freeze_startup_heap)
        log.info("services.started", import_seconds=round(seconds, 3), api=services.api is not None)
    except asyncio.TimeoutError:
        log.error(
            "services.late",
            seconds=deadline,
            consequence="running without the local API and metrics",
        )
    except Exception as exc:
        log.exception("services.failed", error=str(exc))
    finally:
        # Never served: refuse clients rather than keep them waiting.
        if listening is not None:
            from rdmad.api import unixsock

            unixsock.remove(listening)
        if scrape:
            from rdmad.api import tcpsock

            tcpsock.close(scrape)
    return services


async def _first_rest(gate: ReadyGate, wait: float) -> None:
    """Until the agent's first READY=1, or ``wait`` s (logged: the import starts beside
    a pass that is still working)."""
    try:
        await asyncio.wait_for(gate.rested.wait(), wait)
    except asyncio.TimeoutError:
        log.info("services.not-waiting", seconds=wait, why="the first pass has not rested yet")


async def _bind_metrics(spec: MetricsSpec) -> list[socket.socket] | None:
    """The metrics TCP listener's sockets, listening before aiohttp is imported; None
    when there is none to serve or they cannot be bound (logged)."""
    if not spec.listen:
        return None
    from rdmad.api import tcpsock

    try:
        return await tcpsock.bind(spec.listen)
    except (OSError, ValueError) as exc:
        log.error("metrics.listen-failed", listen=spec.listen, error=str(exc))
        return None


def _listen(spec: ApiSpec) -> Listening | None:
    """The API socket, listening, before aiohttp is imported; None when the API is off or
    the socket cannot be made (logged: the daemon runs on without the API)."""
    if not spec.enabled:
        log.info("api.disabled", why="[api] enabled = false")
        return None
    from rdmad.api import unixsock

    try:
        return unixsock.listen(Path(spec.socket), spec.read_group)
    except unixsock.SocketError as exc:
        log.error("api.failed", socket=spec.socket, error=str(exc), consequence=NO_API)
        return None


async def _start_exporters(
    metrics: Metrics, spec: MetricsSpec, sockets: list[socket.socket] | None
) -> list[_Closeable]:
    """The textfile writer and the TCP listener (on ``sockets``, bound already) the
    config asks for. One that cannot start is logged and left out: the daemon's job is
    the node, not its metrics."""
    started: list[_Closeable] = []
    if spec.textfile_dir:
        from rdmad.api.textfile import TextfileWriter

        writer = TextfileWriter(metrics, spec.textfile_dir, spec.textfile_interval)
        writer.start()
        started.append(writer)
        log.info("metrics.textfile", path=str(writer.path), interval=spec.textfile_interval)
    if spec.listen and sockets:
        from rdmad.api.metrics_http import start_tcp_listener

        try:
            listener = await start_tcp_listener(metrics, spec.listen, sockets=sockets)
        except (OSError, ValueError) as exc:
            log.error("metrics.listen-failed", listen=spec.listen, error=str(exc))
        else:
            started.append(listener)
            log.info("metrics.listen", listen=spec.listen, addresses=listener.addresses)
    return started


async def _start_api(
    location: Path,
    spec: ApiSpec,
    listening: Listening | None,
    store: StatusView,
    queue: TriggerQueue,
    metrics: Metrics,
) -> ApiServer | None:
    """The local API on the socket made before READY=1, or None: the API is off, its
    socket could not be made, or it failed to start (logged; the daemon runs on without
    it: keeping the node reconciled matters more than answering questions)."""
    if listening is None:
        return None
    from rdmad.api import ApiServer

    server = ApiServer(store, queue, location, spec, metrics=metrics, listening=listening)
    try:
        await server.start()
    except Exception as exc:
        log.error("api.failed", socket=spec.socket, error=str(exc), consequence=NO_API)
        return None
    return server
