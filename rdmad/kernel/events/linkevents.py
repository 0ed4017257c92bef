"""Link events: an RTMGRP_LINK socket turned into ``LinkEvent`` values, ENOBUFS into "resync".

The same socket hears IPv4/IPv6 address changes ("addr"): an rxe link's GIDs are made
from its netdev's addresses, and nothing else says when they change.

Its own socket, not shared with requests: a subscription must survive a receive-buffer
overflow (the kernel dropped notifications), which then becomes one "resync" event
telling the agent to observe everything again, instead of a dead socket.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import AsyncIterator, Callable
from typing import Literal

import msgspec

from rdmad.kernel.netlink.nlcodec import NlMsg, split_messages
from rdmad.kernel.netlink.nlsock import open_netlink_socket, receive_buffer, recv_nowait
from rdmad.kernel.netlink.rtnl_codec import (
    CHANGE_ALL,
    IFADDR,
    IFF_UP,
    IFINFO,
    RTM_DELADDR,
    RTM_DELLINK,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTMGRP_IPV4_IFADDR,
    RTMGRP_IPV6_IFADDR,
    RTMGRP_LINK,
    link_name,
)

NETLINK_ROUTE = 0
EVENTS_RCVBUF = 8 << 20


class LinkEvent(msgspec.Struct, frozen=True):
    """A link notification. ``kind`` "resync" means events were lost: observe everything again.

    "add" is an RTM_NEWLINK with a full change mask (a new link, or one moved into this
    namespace); "change" is any other RTM_NEWLINK (flags, rename: compare ``name`` with
    ``old_name``); "del" is RTM_DELLINK (deleted, or moved to another namespace);
    "addr" is an IP address added to or removed from the link (``name``: as last heard).
    Track links by ``ifindex``: names change. ``message``: an RTM_NEWLINK's payload
    (ifinfomsg + attributes, as a dump entry without VF lists; ``rtnl_codec.parse_link``
    reads it), so a reader can know the link without asking the kernel again.
    """

    kind: Literal["add", "del", "change", "resync", "addr"]
    ifindex: int = 0
    name: str | None = None
    old_name: str | None = None  # the previous name, when this stream saw it change
    up: bool | None = None
    message: bytes | None = None


class LinkEventStream:
    """Async iterator of ``LinkEvent`` from an RTMGRP_LINK socket; ENOBUFS yields "resync".

    The socket is bound when this is constructed: subscribe first, then observe, and
    nothing falls between the two.
    """

    def __init__(self, netns: str | None = None, rcvbuf: int = EVENTS_RCVBUF) -> None:
        self._sock: socket.socket | None = open_netlink_socket(
            NETLINK_ROUTE,
            netns=netns,
            groups=RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR,
            rcvbuf=rcvbuf,
        )
        self._buf = receive_buffer()
        self._pending: list[LinkEvent] = []
        self._names: dict[int, str] = {}
        self.overflows = 0
        # Called with a new link's name as its news is read, before it is queued
        # (``kernel.events.reflex``: an rxe add sent from here).
        self.on_added: Callable[[str], None] | None = None
        # Read by a reader callback, not by the iterating task when it next runs: news
        # are taken (and the hook called) as soon as the loop sees the socket readable.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._error: Exception | None = None

    @property
    def sock(self) -> socket.socket:
        if self._sock is None:
            raise ValueError("link event stream is closed")
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._unwatch()
            self._sock.close()
            self._sock = None
        self._wake()

    async def __aenter__(self) -> LinkEventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> AsyncIterator[LinkEvent]:
        return self

    async def __anext__(self) -> LinkEvent:
        while not self._pending:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if self._sock is None:
                raise StopAsyncIteration
            loop = self._watch()
            self._drain()
            if not self._pending:
                self._waiter = loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
        return self._pending.pop(0)

    def _watch(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self.sock.fileno(), self._readable)
        return self._loop

    def _unwatch(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed() and self._sock is not None:
            loop.remove_reader(self._sock.fileno())

    def _readable(self) -> None:
        """Reader callback: read what is queued now, then wake the iterator."""
        try:
            self._drain()
        except Exception as exc:  # e.g. a malformed message: the reader's end, as before
            self._error = exc  # raised by __anext__; not read again until then
            self._unwatch()
        if self._pending or self._error is not None:
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _drain(self) -> None:
        """Read everything queued, without blocking."""
        while True:
            try:
                data = recv_nowait(self.sock, self._buf)
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                # The kernel dropped notifications: names seen so far may be stale too.
                self.overflows += 1
                self._names.clear()
                self._pending = [e for e in self._pending if e.kind != "resync"]
                self._pending.append(LinkEvent("resync"))
                continue
            if data is None:
                return
            for msg in split_messages(data):
                event = self._event(msg)
                if event is not None:
                    self._pending.append(event)

    def _event(self, msg: NlMsg) -> LinkEvent | None:
        if msg.type in (RTM_NEWADDR, RTM_DELADDR) and len(msg.data) >= IFADDR.size:
            index = IFADDR.unpack_from(msg.data, 0)[4]
            return LinkEvent("addr", index, self._names.get(index))
        if msg.type not in (RTM_NEWLINK, RTM_DELLINK) or len(msg.data) < IFINFO.size:
            return None
        # The header and the name only: the rest is read by whoever uses ``message``.
        _family, _type, index, flags, change = IFINFO.unpack_from(msg.data, 0)
        name, up = link_name(msg.data), bool(flags & IFF_UP)
        old = self._names.get(index)
        if msg.type == RTM_DELLINK:
            self._names.pop(index, None)
            return LinkEvent("del", index, name, None, up)
        if name is not None:
            self._names[index] = name
        kind: Literal["add", "change"] = "add" if change == CHANGE_ALL else "change"
        if kind == "add" and name is not None and self.on_added is not None:
            self.on_added(name)
        renamed = old if old is not None and old != name else None
        return LinkEvent(kind, index, name, renamed, up, msg.data)
