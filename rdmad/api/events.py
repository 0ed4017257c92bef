"""``GET /v1/events``: server-sent events of status and history changes.

Each stream has its own bounded queue, filled by a store listener with
``put_nowait`` only (the store's listeners run on the reconcile loop). A reader
that falls a queue's length behind is cut off (its connection aborted, so a
writer stuck on its full socket returns too); the loop never waits for a
reader. A ``: keepalive`` comment goes out when nothing else has for a while, so
clients and proxies see a live stream. Streams are counted like connections
(``admission.Slots``): a few per user, and some kept for root, so two read-group users
cannot take every stream from an operator.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import structlog
from aiohttp import web

from rdmad.api import timeouts
from rdmad.api.admission import Limits, Slots
from rdmad.api.auth import PEER
from rdmad.api.documents import status_event
from rdmad.api.errors import ApiError
from rdmad.status import Change, HistoryEntry, StatusSnapshot, StatusView

log = structlog.get_logger("rdmad.api")

QUEUE_SIZE = 256
MAX_STREAMS = 64
STREAM_LIMITS = Limits(connections=MAX_STREAMS - 8, per_uid=16, root_reserved=8)
KEEPALIVE_SECONDS = 15.0

_END = object()  # put by close(): the stream ends


class _Stream:
    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.queue: asyncio.Queue[object] = asyncio.Queue(QUEUE_SIZE)
        self.dropped = False

    def offer(self, change: Change) -> None:
        """The store listener: hand the change on or, if the reader is too far behind,
        drop the reader."""
        if self.dropped:
            return
        kind, _ = change
        if kind not in ("status", "history"):
            return
        try:
            self.queue.put_nowait(change)
        except asyncio.QueueFull:
            self.drop()

    def drop(self) -> None:
        self.dropped = True
        peer = self.request.get(PEER)
        log.warning(
            "api.events-dropped",
            reason=f"reader fell {QUEUE_SIZE} events behind",
            uid=getattr(peer, "uid", None),
            pid=getattr(peer, "pid", None),
        )
        transport = self.request.transport
        if transport is not None:
            transport.abort()  # unblocks a write waiting on the reader's full socket

    def end(self) -> None:
        try:
            self.queue.put_nowait(_END)
        except asyncio.QueueFull:
            self.drop()


def encode(change: Change) -> bytes:
    kind, value = change
    data: dict[str, Any]
    if kind == "status":
        assert isinstance(value, StatusSnapshot)
        data = status_event(value)
    else:
        assert isinstance(value, HistoryEntry)
        data = value.to_json()
    return f"event: {kind}\ndata: {json.dumps(data, default=str)}\n\n".encode()


class EventStreams:
    def __init__(
        self,
        store: StatusView,
        limits: Limits = STREAM_LIMITS,
        keepalive: float = KEEPALIVE_SECONDS,
    ) -> None:
        self._store = store
        self._slots = Slots(limits)
        self._keepalive = keepalive
        self._streams: set[_Stream] = set()
        self._closed = False

    @property
    def count(self) -> int:
        return len(self._streams)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self._closed:
            raise ApiError(503, "the daemon is stopping")
        peer = request.get(PEER)
        uid = getattr(peer, "uid", None)
        slot = self._slots.take(uid)
        if slot is None:
            why = self._slots.why_not(uid).replace("connections", "event streams")
            raise ApiError(503, f"too many event streams: {why}; try again later")
        stream = _Stream(request)
        self._streams.add(stream)
        self._store.subscribe(stream.offer)
        try:
            resp = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await resp.prepare(request)
            try:
                # The current status first, so a watcher need not ask for it separately.
                await resp.write(encode(("status", self._store.current)))
                await self._pump(stream, resp)
            except ConnectionError:
                pass  # the reader left, or was dropped for falling behind
            return resp
        finally:
            self._store.unsubscribe(stream.offer)
            self._streams.discard(stream)
            self._slots.give_back(slot)

    async def _pump(self, stream: _Stream, resp: web.StreamResponse) -> None:
        while not stream.dropped:
            try:
                async with timeouts.timeout(self._keepalive):
                    item = await stream.queue.get()
            except asyncio.TimeoutError:
                await resp.write(b": keepalive\n\n")
                continue
            if item is _END:
                return
            assert isinstance(item, tuple)
            await resp.write(encode(item))

    def close(self) -> None:
        """End every stream (the daemon is stopping)."""
        self._closed = True
        for stream in list(self._streams):
            stream.end()
