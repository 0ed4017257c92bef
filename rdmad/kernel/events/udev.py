"""udev events (net, pci, infiniband, infiniband_verbs, module) on the asyncio loop.

The monitor's netlink fd is watched with ``loop.add_reader`` and drained without
blocking: no thread, no polling timer (tuned, the model, runs a thread per monitor
and swallows its exceptions). Each uevent becomes a small ``UdevEvent``.

Source: "udev" events come after udevd processed the device (renamed it, ran its
rules), which is what rdmad must react to: a net "add" from the kernel source
still carries the name the interface is about to lose. Only where no udevd runs
(containers, this project's dev host) is the kernel source used; then there is
no rename to wait for. ``default_source()`` picks.

The receive buffer is large (128 MiB, as tuned uses): a driver reload with many
VFs sends hundreds of uevents in a burst. If the kernel still drops some (ENOBUFS),
the stream yields one ``UdevEvent`` with action "resync": observe everything again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import AsyncIterator, Iterable
from typing import Any, Literal

import msgspec
import pyudev

from rdmad import udevdb

SUBSYSTEMS = ("net", "pci", "infiniband", "infiniband_verbs", "module")
RECEIVE_BUFFER = 128 * 1024 * 1024
# What can change rdmad's view. "change" on pci is config-space noise; "online"/
# "offline" are CPU/memory actions; "move" is a rename.
WANTED: dict[str, frozenset[str]] = {
    "net": frozenset({"add", "remove", "move", "change"}),
    "pci": frozenset({"add", "remove", "bind", "unbind"}),
    "infiniband": frozenset({"add", "remove", "move", "change"}),
    "infiniband_verbs": frozenset({"add", "remove"}),
    "module": frozenset({"add", "remove"}),
}

Source = Literal["udev", "kernel"]


class UdevEvent(msgspec.Struct, frozen=True):
    """One uevent, reduced to what the agent uses to decide it must look again.

    ``interface`` is the netdev name the event carries (INTERFACE), which after a
    rename ("move") is the new name; ``old_name`` is the name before a rename.
    Track netdevs by ``ifindex``: names change.
    """

    action: str  # add, remove, move, change, bind, unbind, or "resync"
    subsystem: str
    sysname: str
    devpath: str
    ifindex: int | None = None
    interface: str | None = None
    old_name: str | None = None
    driver: str | None = None
    source: Source = "udev"

    def describe(self) -> str:
        extra = f" (was {self.old_name})" if self.old_name else ""
        return f"{self.action} {self.subsystem} {self.sysname}{extra}"


RESYNC = UdevEvent("resync", "", "", "")


def udevd_running(root: str = "/") -> bool:
    """udevd listens on /run/udev/control; without it no "udev" source event ever comes."""
    return os.path.exists(os.path.join(root, udevdb.CONTROL))


def default_source() -> Source:
    return "udev" if udevd_running() else "kernel"


def to_event(device: Any, source: Source) -> UdevEvent | None:
    """A pyudev Device from the monitor -> UdevEvent; None for noise.

    Net "add"/"move" from the udev source must be initialised (udevd done with it);
    from the kernel source there is no udevd to wait for.
    """
    action = device.action or ""
    subsystem = device.subsystem or ""
    if action not in WANTED.get(subsystem, frozenset()):
        return None
    props = device.properties
    if subsystem == "net":
        if source == "udev" and action in ("add", "move") and not device.is_initialized:
            return None
        ifindex_text = props.get("IFINDEX")
        old_path = props.get("DEVPATH_OLD")
        return UdevEvent(
            action=action,
            subsystem=subsystem,
            sysname=device.sys_name,
            devpath=device.device_path,
            ifindex=int(ifindex_text) if ifindex_text and ifindex_text.isdigit() else None,
            interface=props.get("INTERFACE") or device.sys_name,
            old_name=old_path.rsplit("/", 1)[-1] if old_path else None,
            driver=props.get("ID_NET_DRIVER"),
            source=source,
        )
    return UdevEvent(
        action=action,
        subsystem=subsystem,
        sysname=device.sys_name,
        devpath=device.device_path,
        driver=props.get("DRIVER") or device.driver,
        source=source,
    )


class QueuedEvents:
    """What the uevent readers share: a queue their reader callback fills, None in it
    ending the iteration (raising the error that closed the reader, if any)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[UdevEvent | None] = asyncio.Queue()
        self._error: BaseException | None = None
        self.overflows = 0

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _started(self) -> bool:
        raise NotImplementedError

    def __aiter__(self) -> AsyncIterator[UdevEvent]:
        return self

    async def __anext__(self) -> UdevEvent:
        if not self._started():
            self.start()
        event = await self._queue.get()
        if event is None:
            self._queue.put_nowait(None)  # every later call ends too
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        return event

    def _read_failed(self, exc: OSError) -> bool:
        """The socket failed: an overflow (ENOBUFS) becomes one "resync" event, read on
        (True); anything else closes the reader and ends the iteration with it."""
        if exc.errno == errno.ENOBUFS:
            self.overflows += 1
            self._queue.put_nowait(RESYNC)
            return True
        self._error = exc
        self.close()
        return False


class UdevMonitor(QueuedEvents):
    """Async iterator of ``UdevEvent``; use as ``async with UdevMonitor() as m: async for e in m``.

    The socket is subscribed when the context is entered, so "subscribe, then
    observe" misses nothing. ``close()`` ends the iteration cleanly.
    """

    def __init__(
        self,
        subsystems: Iterable[str] = SUBSYSTEMS,
        *,
        source: Source | None = None,
        receive_buffer: int = RECEIVE_BUFFER,
    ) -> None:
        super().__init__()
        self.subsystems = tuple(subsystems)
        self.source: Source = source or default_source()
        self.receive_buffer = receive_buffer
        self._monitor: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def start(self) -> None:
        """Open and subscribe the monitor and hook its fd into the running loop."""
        if self._monitor is not None:
            return
        if self._closed:
            raise ValueError("udev monitor is closed")
        monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source=self.source)
        for subsystem in self.subsystems:
            monitor.filter_by(subsystem)
        # Not root: the default buffer still works, bursts may overflow (-> "resync").
        with contextlib.suppress(OSError):
            monitor.set_receive_buffer_size(self.receive_buffer)
        monitor.start()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(monitor.fileno(), self._drain)
        self._monitor = monitor

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._monitor is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._monitor.fileno())
            self._monitor = None  # pyudev frees the socket with the object
        self._queue.put_nowait(None)

    async def __aenter__(self) -> UdevMonitor:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def _started(self) -> bool:
        return self._monitor is not None or self._closed

    def _drain(self) -> None:
        """Reader callback: take every queued uevent without blocking."""
        monitor = self._monitor
        while monitor is not None:
            try:
                device = monitor.poll(timeout=0)
            except OSError as exc:
                if self._read_failed(exc):
                    continue
                return
            if device is None:
                return
            event = to_event(device, self.source)
            if event is not None:
                self._queue.put_nowait(event)
