"""The API server: the aiohttp application on the UNIX socket, started and closed by
the daemon. It holds the status store, the trigger queue and the config location,
never the agent.

Limits (docs/API.md): bodies up to 64 KiB, a request must arrive within
``request_timeout`` (aiohttp's keep-alive timer runs from the connection's start,
so a client that sends half a request and stalls is cut off, and so is one that
connects and sends nothing; a body that stalls gets 408), at most ``MAX_IN_FLIGHT``
requests handled at once and 64 event streams (``events.STREAM_LIMITS``). A handler
whose client goes away is cancelled (``handler_cancellation``). Connections are bounded
per peer uid and in all, with slots kept for root (``admission``): root's status
answers during a flood.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog
from aiohttp import web

from rdmad.api import admission, auth, errors, unixsock
from rdmad.api.events import KEEPALIVE_SECONDS, EventStreams
from rdmad.api.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from rdmad.api.metrics import Metrics
from rdmad.api.ownunit import own_unit
from rdmad.api.routes import MAX_BODY, Routes
from rdmad.api.waiting import Waiters
from rdmad.model import ApiSpec, Observed
from rdmad.status import StatusView
from rdmad.triggers import TriggerQueue

log = structlog.get_logger("rdmad.api")

REQUEST_TIMEOUT = 5.0
MAX_IN_FLIGHT = 256
SHUTDOWN_SECONDS = 2.0


def _observe_host() -> Observed:
    from rdmad.kernel.apply.oneshot import observe_host

    return observe_host(Path("/"))


class ApiServer:
    def __init__(
        self,
        store: StatusView,
        queue: TriggerQueue,
        config_location: Path,
        spec: ApiSpec,
        *,
        observe: Callable[[], Observed] = _observe_host,
        request_timeout: float = REQUEST_TIMEOUT,
        keepalive: float = KEEPALIVE_SECONDS,  # seconds between ": keepalive" on event streams
        metrics: Metrics | None = None,  # the daemon's one Metrics; None: the server makes its own
        pause_root: str = "/",  # where run/rdmad/pause.json is written (a tree in tests)
        limits: admission.Limits | None = None,  # None: API_LIMITS fitted to the fd limit
        listening: unixsock.Listening | None = None,  # made already (the daemon's, before READY)
    ) -> None:
        self._given = listening
        self.limits = limits
        self.pause_root = pause_root
        self.store = store
        self.queue = queue
        self.config_location = config_location
        self.spec = spec
        self.observe = observe
        self.request_timeout = request_timeout
        self.events = EventStreams(store, keepalive=keepalive)
        self.waiters: Waiters | None = None
        self.notes: tuple[str, ...] = ()
        self.listening: unixsock.Listening | None = None
        self.routes: Routes | None = None  # the endpoints, once started (benchmarks call them)
        self._runner: web.AppRunner | None = None
        self.acceptor: admission.Acceptor | None = None
        self.metrics = metrics
        self._own_metrics = metrics is None

    @property
    def path(self) -> Path:
        return Path(self.spec.socket)

    async def start(self) -> None:
        """Create the socket (final owner and mode), or take the one given, and serve;
        raise SocketError or OSError if it cannot be done (the daemon logs it and runs on
        without the API). A socket given is removed too when serving fails."""
        spec = self.spec
        listening, self._given = self._given, None
        if listening is None:
            listening = unixsock.listen(self.path, spec.read_group)
        notes = [listening.note] if listening.note else []
        read_gid = None if listening.note else listening.gid
        write_gid = unixsock.group_id(spec.write_group)
        if spec.write_group is not None and write_gid is None:
            notes.append(
                f"write group {spec.write_group!r} does not exist: mutations are root-only"
            )
        self.notes = tuple(notes)
        for note in notes:
            log.warning("api.note", note=note)
        try:
            self.waiters = Waiters(self.store)
            routes = Routes(
                self.store,
                self.queue,
                self.config_location,
                self.events,
                self.waiters,
                self.observe,
                request_timeout=self.request_timeout,
                api_notes=self.notes,
                unit=own_unit(),
                pause_root=self.pause_root,
            )
            self._attach_metrics(routes)
            self.routes = routes
            app = web.Application(
                client_max_size=MAX_BODY,
                middlewares=[
                    errors.json_errors,
                    auth.middleware(auth.Policy(read_gid, write_gid)),
                    errors.limits(MAX_IN_FLIGHT),
                ],
            )
            routes.register(app)
            runner = web.AppRunner(
                app,
                handle_signals=False,
                handler_cancellation=True,
                access_log=None,
                keepalive_timeout=self.request_timeout,
                shutdown_timeout=SHUTDOWN_SECONDS,
            )
            await runner.setup()
            self._runner = runner
            assert runner.server is not None  # set up
            limits = self.limits or admission.fit(admission.API_LIMITS, admission.fd_limit())
            self.acceptor = admission.Acceptor(
                listening.sock,
                runner.server,
                admission.Slots(limits),
                name="api",
                peer_uid=auth.peer_uid,
            )
            self.acceptor.start()
        except BaseException:
            unixsock.remove(listening)
            await self._stop_runner()
            raise
        self.listening = listening
        log.info(
            "api.listening",
            socket=str(self.path),
            mode=oct(listening.mode),
            read_group=spec.read_group if read_gid is not None else None,
            write_group=spec.write_group if write_gid is not None else None,
            connections=f"{limits.connections} ({limits.per_uid} per user) + "
            f"{limits.root_reserved} for root",
        )

    def _attach_metrics(self, routes: Routes) -> None:
        """/metrics serves the daemon's Metrics (the same numbers as its textfile and TCP
        listener), or the server's own when it was given none (tests, benchmarks)."""
        if self.metrics is None:
            self.metrics = Metrics(self.store, self.queue)
        routes.metrics = self.metrics
        routes.metrics_content_type = METRICS_CONTENT_TYPE

    async def close(self) -> None:
        """End event streams, answer waiting requests (503), stop serving, remove the socket."""
        self.events.close()
        if self.waiters is not None:
            self.waiters.close()
        await self._stop_runner()
        if self._own_metrics and self.metrics is not None:
            self.metrics.close()
        if self.listening is not None:
            unixsock.remove(self.listening)
            self.listening = None

    async def _stop_runner(self) -> None:
        acceptor, self.acceptor = self.acceptor, None
        if acceptor is not None:
            await acceptor.close()  # no new connections; the runner closes the open ones
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
