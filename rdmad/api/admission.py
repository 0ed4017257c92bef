"""Which connections the API socket and the metrics listener take, and their accept loop.

Every connection costs the daemon a file descriptor, and the daemon needs its
descriptors for its own job: listing /proc to find a VF's holders, netlink sockets,
modprobe's pipes. Two local users holding a thousand idle connections once left it
with none (EMFILE on every /proc listing) and root's `rdmad-ctl status` unanswered.
So each listener takes a bounded number of connections (``Limits``): on the UNIX
socket at most ``per_uid`` from one non-root user and ``connections`` from everyone
together, plus ``root_reserved`` slots that only uid 0 may use, so root's status
answers during a flood. A connection past the bounds is accepted and closed at once
(with a 503 for whoever reads it), never left in the backlog where root's would wait
behind it. The bounds together sit well below the daemon's descriptor limit
(``LimitNOFILE=`` in the unit; ``fit`` shrinks them where the limit is lower).

Why an accept loop of its own (``Acceptor``): aiohttp has no bound on connections
(its server takes whatever asyncio's accept loop hands it, and asyncio's
``create_server`` has no hook to refuse a connection before a protocol is made for
it, nor one that sees the peer's credentials), and asyncio's accept loop meets EMFILE
by logging "socket.accept() out of system resource" with a traceback at every retry,
once a second for as long as it lasts. Here an accept that fails for want of a
resource pauses accepting (50 ms, doubling up to 1 s) and is logged once when it
starts and once when it ends. Admitted sockets go to aiohttp's own server
(``AppRunner.server``, the protocol factory its sites use) through
``loop.connect_accepted_socket``; everything HTTP stays aiohttp's: parsing, the
keep-alive timer that also bounds how long a client may take to send its request
line and headers (it runs from the connection's start), handler cancellation and
shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import resource
import socket
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import structlog

log = structlog.get_logger("rdmad.api")

# accept(2) failing for want of a resource: pause, do not spin.
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# The peer went away between its connect and our accept: nothing to do but go on.
GONE_ERRNOS = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN})
PAUSE_FIRST = 0.05
PAUSE_MAX = 1.0
REFUSALS_LOGGED_EVERY = 60.0  # seconds: a flood is one warning a minute, not one per connection
# Client connections may take this share of the descriptor limit, all listeners together.
FD_SHARE = 4
UNKNOWN_UID = -1  # SO_PEERCRED could not be read: counted as one more non-root user


class Limits(msgspec.Struct, frozen=True):
    """How many connections a listener keeps open at once."""

    connections: int  # everyone together (root too, once its reserve is in use)
    per_uid: int | None = None  # at most this many from one non-root uid (UNIX socket)
    root_reserved: int = 0  # more, for uid 0 only

    @property
    def most(self) -> int:
        return self.connections + self.root_reserved

    def scaled(self, factor: float) -> Limits:
        """Smaller by ``factor`` (< 1), each bound kept at 1 or more."""
        per_uid = None if self.per_uid is None else max(1, int(self.per_uid * factor))
        return msgspec.structs.replace(
            self,
            connections=max(1, int(self.connections * factor)),
            per_uid=per_uid,
            root_reserved=max(1 if self.root_reserved else 0, int(self.root_reserved * factor)),
        )


# The local API: one user's `watch` and a few scripts need a handful; the read group
# together 128; root 32 more of its own. The metrics listener: a scraper or two.
API_LIMITS = Limits(connections=128, per_uid=32, root_reserved=32)
METRICS_LIMITS = Limits(connections=32)


def fd_limit() -> int | None:
    """The soft RLIMIT_NOFILE, None when unlimited."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def fit(limits: Limits, fd_soft_limit: int | None) -> Limits:
    """``limits`` shrunk so that every listener's bounds together (API_LIMITS and
    METRICS_LIMITS) take at most 1/FD_SHARE of the descriptor limit; unchanged where
    the limit leaves room (LimitNOFILE=4096 in the unit: 1024 for 192 connections)."""
    if fd_soft_limit is None:
        return limits
    budget = fd_soft_limit // FD_SHARE
    wanted = API_LIMITS.most + METRICS_LIMITS.most
    if wanted <= budget:
        return limits
    return limits.scaled(max(budget, 1) / wanted)


class Slot(msgspec.Struct, frozen=True):
    uid: int | None
    reserved: bool


class Slots:
    """The connections a listener holds, by peer uid; what may be taken."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.shared = 0
        self.reserved = 0
        self.by_uid: Counter[int | None] = Counter()

    @property
    def open(self) -> int:
        return self.shared + self.reserved

    def take(self, uid: int | None) -> Slot | None:
        """A slot for a connection from ``uid`` (None: not known, a TCP peer), or None."""
        limits = self.limits
        if uid == 0 and self.reserved < limits.root_reserved:
            self.reserved += 1
            self.by_uid[uid] += 1
            return Slot(uid, reserved=True)
        if self._user_full(uid):
            return None
        if self.shared >= limits.connections:
            return None
        self.shared += 1
        self.by_uid[uid] += 1
        return Slot(uid, reserved=False)

    def _user_full(self, uid: int | None) -> bool:
        per_uid = self.limits.per_uid
        return uid not in (0, None) and per_uid is not None and self.by_uid[uid] >= per_uid

    def give_back(self, slot: Slot) -> None:
        if slot.reserved:
            self.reserved -= 1
        else:
            self.shared -= 1
        self.by_uid[slot.uid] -= 1
        if self.by_uid[slot.uid] <= 0:
            del self.by_uid[slot.uid]

    def why_not(self, uid: int | None) -> str:
        """Why ``take(uid)`` refused, in words for the 503 and the log."""
        if self._user_full(uid):
            return f"uid {uid} has {self.limits.per_uid} connections open, the most one user may"
        return f"{self.open} connections open, the most this listener takes"


class _Admitted(asyncio.Protocol):
    """aiohttp's protocol for one admitted connection; its slot is given back when the
    connection ends (whoever ends it: the client, a timeout, shutdown)."""

    def __init__(self, inner: asyncio.Protocol, release: Callable[[], None]) -> None:
        self._inner = inner
        self._release: Callable[[], None] | None = release

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self._inner.connection_lost(exc)
        finally:
            self.release()

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


ProtocolFactory = Callable[[], asyncio.Protocol]
Accept = Callable[[socket.socket], Awaitable[tuple[socket.socket, Any]]]
PeerUid = Callable[[socket.socket], int]


class Acceptor:
    """Accepts on ``sock``, admits within ``slots`` (shared by the listener's sockets),
    hands admitted connections to ``factory`` (aiohttp's server). ``peer_uid``: the UNIX
    socket's SO_PEERCRED uid (None: a TCP listener, where no uid is known). ``accept``:
    loop.sock_accept (tests put a failing one in its place)."""

    def __init__(
        self,
        sock: socket.socket,
        factory: ProtocolFactory,
        slots: Slots,
        *,
        name: str,
        peer_uid: PeerUid | None = None,
        accept: Accept | None = None,
        pause_first: float = PAUSE_FIRST,
        pause_max: float = PAUSE_MAX,
    ) -> None:
        self.sock = sock
        self.factory = factory
        self.slots = slots
        self.name = name
        self.peer_uid = peer_uid
        self._accept = accept
        self.pause_first = pause_first
        self.pause_max = pause_max
        self.admitted = 0
        self.refused = 0
        self.accept_errors = 0  # failed accepts (for want of a resource, or unexpected)
        self._task: asyncio.Task[None] | None = None
        self._refused_unlogged = 0
        self._refusals_logged_at: float | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._serve(), name=f"rdmad-accept-{self.name}")

    async def close(self) -> None:
        """Stop accepting (the listening socket is the caller's to close)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        accept = self._accept or loop.sock_accept
        paused_at: float | None = None  # when accepts began to fail (None: they work)
        failed = 0  # accepts failed since then
        delay = self.pause_first
        while True:
            try:
                conn, _addr = await accept(self.sock)
            except OSError as exc:
                if exc.errno in GONE_ERRNOS:
                    continue
                self.accept_errors += 1
                failed += 1
                if paused_at is None:
                    paused_at = loop.time()
                    log.warning(
                        "api.accept-paused",
                        listener=self.name,
                        error=str(exc),
                        open=self.slots.open,
                        consequence="not accepting connections until it clears; retrying",
                    )
                await asyncio.sleep(delay)  # any lasting error: never a busy loop
                delay = min(delay * 2, self.pause_max)
                continue
            if paused_at is not None:
                log.info(
                    "api.accept-resumed",
                    listener=self.name,
                    failed_accepts=failed,
                    seconds=round(loop.time() - paused_at, 3),
                )
                paused_at, failed, delay = None, 0, self.pause_first
            try:
                await self._admit(loop, conn)
            except Exception:  # a bug here must cost one connection, never the listener
                log.exception("api.admit-failed", listener=self.name)
                conn.close()

    async def _admit(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
        uid: int | None = None
        if self.peer_uid is not None:
            try:
                uid = self.peer_uid(conn)
            except OSError:
                uid = UNKNOWN_UID
        slot = self.slots.take(uid)
        if slot is None:
            self._refuse(loop, conn, uid)
            return
        self.admitted += 1
        protocol: _Admitted | None = None
        try:
            protocol = _Admitted(self.factory(), lambda: self.slots.give_back(slot))
            conn.setblocking(False)
            await loop.connect_accepted_socket(lambda: protocol, sock=conn)
        except BaseException as exc:
            if protocol is not None:
                protocol.release()
            else:
                self.slots.give_back(slot)
            conn.close()
            if not isinstance(exc, OSError | RuntimeError):
                raise
            log.debug("api.connection-failed", listener=self.name, error=str(exc))

    def _refuse(
        self, loop: asyncio.AbstractEventLoop, conn: socket.socket, uid: int | None
    ) -> None:
        """Closed at once, with a 503 for a client that reads it (best effort, never
        waiting: a fresh socket's send buffer takes these few hundred bytes)."""
        why = self.slots.why_not(uid)
        self.refused += 1
        with contextlib.suppress(OSError):
            conn.setblocking(False)
            conn.send(refusal(why))
        conn.close()
        self._refused_unlogged += 1
        now = loop.time()
        last = self._refusals_logged_at
        if last is None or now - last >= REFUSALS_LOGGED_EVERY:
            log.warning(
                "api.connections-refused",
                listener=self.name,
                refused=self._refused_unlogged,
                why=why,
                limits=f"{self.slots.limits}",
            )
            self._refused_unlogged = 0
            self._refusals_logged_at = now


def refusal(why: str) -> bytes:
    """The 503 a refused connection gets, in the API's error shape."""
    body = json.dumps(
        {"error": {"status": 503, "code": "unavailable", "message": f"busy: {why}; try again"}}
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


__all__ = [
    "API_LIMITS",
    "METRICS_LIMITS",
    "Acceptor",
    "Limits",
    "Slots",
    "fd_limit",
    "fit",
    "refusal",
]
