"""The kernel's own uevents for a few subsystems, read straight off the netlink socket.

The early source of RDMA device events (``daemon``): the kernel's ``remove`` of an RDMA
device is what puts a deleted rxe link back, and udevd's copy of it comes later. Read by
hand, not through pyudev, because of what that costs on the event path: pyudev builds a
libudev device for every uevent and reads each property through ctypes, 2-9 ms per RDMA
event in the lab guest (bench/RESULTS.md), where this reader does one ``recvfrom`` and,
for an event of a wanted subsystem only, one ``split``. pyroute2's uevent socket decodes
every property of every uevent the node sends (a driver reload's hundreds) into a message
object. The format is the kernel's (lib/kobject_uevent.c): ``action@devpath`` and then
``KEY=value`` strings, each NUL-terminated.

The kernel drops the other subsystems' uevents before they reach the socket
(``uevent_filter``: a veth pair's queues, a driver reload's hundreds), so they do not
wake the reader. Only messages from the kernel itself count (sender port 0; udevd's
rebroadcasts go to another group). An overflow (ENOBUFS) yields one "resync" event,
as ``UdevMonitor`` does. The daemon reads only RDMA devices so: a netdev's name
settles only after udevd ran its rules.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Collection, Mapping

from rdmad.kernel.events.udev import RECEIVE_BUFFER, QueuedEvents, UdevEvent
from rdmad.kernel.events.uevent_filter import SCAN, attach_uevent_filter
from rdmad.kernel.netlink.nlsock import open_netlink_socket

log = logging.getLogger(__name__)

NETLINK_KOBJECT_UEVENT = 15
KERNEL_GROUP = 1
MAX_UEVENT = 8192  # the kernel's UEVENT_BUFFER_SIZE is 2048; room to spare


def parse_uevent(data: bytes, wanted: Mapping[str, Collection[str]]) -> UdevEvent | None:
    """A kernel uevent -> UdevEvent when ``wanted`` lists its subsystem and action."""
    fields = data.split(b"\0")
    props: dict[str, str] = {}
    for field in fields[1:]:
        key, sep, value = field.partition(b"=")
        if sep:
            props[key.decode("ascii", "replace")] = value.decode("utf-8", "replace")
    subsystem = props.get("SUBSYSTEM", "")
    action = props.get("ACTION", "")
    devpath = props.get("DEVPATH", "")
    if action not in wanted.get(subsystem, ()) or not devpath:
        return None
    return UdevEvent(
        action=action,
        subsystem=subsystem,
        sysname=devpath.rsplit("/", 1)[-1],
        devpath=devpath,
        driver=props.get("DRIVER"),
        source="kernel",
    )


class KernelUevents(QueuedEvents):
    """Async iterator of ``UdevEvent`` (source "kernel"): ``wanted`` actions by subsystem.

    Subscribed when constructed, so "subscribe, then observe" misses nothing; the fd is
    watched with ``loop.add_reader`` once ``start()`` runs in the loop. ``close()`` ends
    the iteration.
    """

    def __init__(
        self, wanted: Mapping[str, Collection[str]], *, receive_buffer: int = RECEIVE_BUFFER
    ) -> None:
        super().__init__()
        self.wanted = dict(wanted)
        # Cheap test before any parsing: most of a busy node's uevents are other subsystems.
        self._markers = tuple(f"\0SUBSYSTEM={s}\0".encode() for s in self.wanted)
        self._sock: socket.socket | None = open_netlink_socket(
            NETLINK_KOBJECT_UEVENT, groups=KERNEL_GROUP, rcvbuf=receive_buffer
        )
        self.filtered = True  # the kernel drops other subsystems' uevents (uevent_filter)
        try:
            span = attach_uevent_filter(self._sock, self.wanted)
        except (OSError, ValueError) as exc:  # read them all then; the markers still sort
            self.filtered = False
            log.warning("uevent socket filter not attached (%s): every uevent is read", exc)
        else:
            if span < SCAN:
                log.info(
                    "uevent socket filter searches %d bytes (net.core.optmem_max is low):"
                    " uevents of longer device paths are read and dropped here",
                    span,
                )
        self._loop: asyncio.AbstractEventLoop | None = None
        # Called with each wanted event as it is read, before it is queued
        # (``kernel.events.reflex``: an rxe add sent from here).
        self.on_event: Callable[[UdevEvent], None] | None = None

    def start(self) -> None:
        if self._loop is not None:
            return
        if self._sock is None:
            raise ValueError("uevent reader is closed")
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._drain)

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(sock.fileno())
        sock.close()
        self._queue.put_nowait(None)

    def _started(self) -> bool:
        return self._loop is not None or self._sock is None

    def _drain(self) -> None:
        """Reader callback: take every queued uevent without blocking."""
        while (sock := self._sock) is not None:
            try:
                data, (port, _groups) = sock.recvfrom(MAX_UEVENT)
            except BlockingIOError:
                return
            except OSError as exc:
                if self._read_failed(exc):
                    continue
                return
            if port != 0 or not any(m in data for m in self._markers):
                continue  # not from the kernel, or a subsystem nobody asked for
            event = parse_uevent(data, self.wanted)
            if event is not None:
                if self.on_event is not None:
                    self.on_event(event)
                self._queue.put_nowait(event)
