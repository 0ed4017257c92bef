"""rxe adds sent by an event reader itself, the moment the event a reaction awaits is read.

The agent arms them when a pass ends at rest (``reconcile.reactions``: rxe creations
only, planned ahead by plan() itself) and disarms them when the next pass starts, so an
armed reflex never fires beside a pass: rdmad keeps one writer, and the pass that the
same event starts is the add's check (``KernelHost.apply`` collects the outcome instead
of sending the add again). What this saves is everything between reading the event and
the send: the trigger queue, waking the agent, the pass's own Python, 10-15 ms under
emulation, about what the kernel's own work takes (bench/RESULTS.md).

Before each send the agent's gate has the last word (nothing else pending that would
disarm the reaction) and a guarded stop in force holds it back. Only those checks and
the socket come before the send: the kernel makes the device within ``send()``, and
under emulation each step of Python or system calls on this path costs 0.1-1 ms
(bench/NOTES.md). The bookkeeping comes after it, and so does the claim: the agent's
``made`` writes it when the kernel says it made the link, in the same callback, before
anything else runs; a crash between the two leaves a link rdmad made but does not
claim, which it then leaves alone as anyone's (never the other way round: a claim for
a link the kernel refused could make someone else's link of that name rdmad's).

The RDMA netlink socket is opened for one add and closed with its outcome: an open
NETLINK_RDMA socket pins ib_core. An add the kernel refuses (EEXIST/ENFILE) right after
it removed the device of that name is sent again, as ``KernelHost`` does (the name stays
taken until the old device's release ends, and no event says when): here from timer
callbacks, without a task. Written by hand: pyroute2 has no RDMA netlink, and one
prebuilt message needs no more than ``nlsock``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rdmad.clock import Cancellable, Clock
from rdmad.kernel.netlink.nlcodec import (
    NLM_F_ACK,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    pack_message,
    parse_error,
    split_messages,
)
from rdmad.kernel.netlink.nlsock import NetlinkFailure, open_request_socket, recv_nowait
from rdmad.kernel.netlink.rdma_codec import (
    CMD_NEWLINK,
    NETLINK_RDMA,
    encode,
    newlink_attrs,
    nldev_type,
)
from rdmad.kernel.pause import read_pause
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import AddRxe

log = logging.getLogger(__name__)

# Refusals that mean "the name is still taken" (kernel.apply.host: _RXE_TAKEN).
TAKEN = frozenset({errno.EEXIST, errno.ENFILE})
# Faster than KernelHost's pace: nothing else waits on the loop meanwhile (the pass
# waits for the outcome first), and the release ends a few ms after the uevent.
RETRY_FIRST = 0.001
RETRY_MAX = 0.002
RELEASE_WAIT = 1.0  # then the pass takes over (KernelHost's own release wait)
SEQ = 1

Gate = Callable[[AddRxe], bool]
Made = Callable[[AddRxe], None]  # the kernel made the link an add was sent for
Outcome = NetlinkFailure | None  # None: the kernel made the link


@dataclass(eq=False)
class Firing:
    """One add sent by a reflex: its socket while unanswered, and its outcome."""

    action: AddRxe
    started: float
    outcome: asyncio.Future[Outcome]
    release_expected: bool  # fired by the removal of the device of that name
    sock: socket.socket | None = None
    retry: Cancellable | None = None
    pause: float = RETRY_FIRST
    sends: int = 0
    message: bytes = field(default=b"", repr=False)
    watched: bool = False  # its socket has a reader in the loop
    made: Made | None = field(default=None, repr=False)  # told when the kernel made it


class RxeReflex:
    """rxe adds by the netdev or RDMA device whose event makes them due; see the module."""

    def __init__(
        self, sysfs: Sysfs, clock: Clock, opener: Callable[[], socket.socket] | None = None
    ) -> None:
        self.sysfs = sysfs
        self.clock = clock
        self._open = opener or _open_rdma_socket
        self._on_netdev: dict[str, tuple[AddRxe, ...]] = {}
        self._on_removed: dict[str, tuple[AddRxe, ...]] = {}
        self._gate: Gate | None = None
        self._made: Made | None = None
        self._fired: dict[str, Firing] = {}  # by rxe link name, until the pass takes it
        # The armed adds' requests, built when armed rather than on the event path.
        self._requests: dict[AddRxe, bytes] = {}
        self.fired = 0  # adds ever sent by a reflex (tests, benchmarks)

    @property
    def armed(self) -> bool:
        return self._gate is not None

    def arm(
        self,
        on_netdev: Mapping[str, Sequence[AddRxe]],
        on_removed: Mapping[str, Sequence[AddRxe]],
        gate: Gate,
        made: Made | None = None,
    ) -> None:
        self._on_netdev = {k: tuple(v) for k, v in on_netdev.items() if v}
        self._on_removed = {k: tuple(v) for k, v in on_removed.items() if v}
        self._gate, self._made = gate, made
        armed = [
            a for adds in (*self._on_netdev.values(), *self._on_removed.values()) for a in adds
        ]
        self._requests = {a: _request(a) for a in armed}
        # An outcome no pass took (its pass did not apply that add): not news any more.
        for name in [n for n, f in self._fired.items() if f.outcome.done()]:
            del self._fired[name]

    def disarm(self) -> None:
        self._on_netdev, self._on_removed, self._gate, self._made = {}, {}, None, None
        self._requests = {}

    def close(self) -> None:
        self.disarm()
        for firing in self._fired.values():
            self._finish(firing, NetlinkFailure(errno.ECANCELED, "rdmad is stopping"))
        self._fired.clear()

    # --- the readers' hooks (synchronous, in their callbacks) -------------------------

    def netdev_added(self, name: str) -> None:
        """A link news "add" of this name was read."""
        if self._gate is not None and name in self._on_netdev:
            for action in self._on_netdev.pop(name):
                self._fire_safely(action, release_expected=False)

    def rdma_removed(self, name: str) -> None:
        """The kernel's `remove` uevent of this RDMA device was read."""
        if self._gate is not None and name in self._on_removed:
            for action in self._on_removed.pop(name):
                self._fire_safely(action, release_expected=True)

    # --- the pass's end ----------------------------------------------------------------

    def take(self, action: AddRxe) -> Firing | None:
        """The add a reflex sent for ``action``'s link on its netdev (its outcome may
        still be pending), once."""
        firing = self._fired.get(action.name)
        if firing is None or firing.action.netdev != action.netdev:
            return None
        del self._fired[action.name]
        return firing

    async def answered(self, timeout: float) -> None:
        """Until every add sent has its outcome, or ``timeout`` (real time) passed."""
        waiting = [f.outcome for f in self._fired.values() if not f.outcome.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=timeout)

    # --- sending -----------------------------------------------------------------------

    def _fire_safely(self, action: AddRxe, *, release_expected: bool) -> None:
        """A bug here must not end the event reader that called: the pass adds the link."""
        try:
            self._fire(action, release_expected=release_expected)
        except Exception:
            log.exception("%s: the reflex failed; the pass adds the link", action.obj)

    def _fire(self, action: AddRxe, *, release_expected: bool) -> None:
        gate = self._gate
        if gate is None or action.name in self._fired:
            return
        if not self.sysfs.exists("sys/module/ib_core"):
            return  # opening the socket would make the kernel load it: the pass decides
        if read_pause(self.sysfs, self.clock.wall()) is not None:
            return  # a guarded stop: the pass reports what waits
        if release_expected and not self.sysfs.netdev_exists(action.netdev):
            # Deleting a netdev removes its rxe device too, and that removal's uevent can
            # be read before the link news of the deletion: the add would be refused
            # (ENODEV) and reported as a failed write. The pass sees the netdev gone.
            return
        if not gate(action):
            return
        started = self.clock.monotonic()
        message = self._requests.get(action) or _request(action)
        sock: socket.socket | None = None
        failure: NetlinkFailure | None = None
        try:  # the send as soon as the checks allow (see the module)
            sock = self._open()
            sock.send(message)
        except OSError as exc:
            failure = NetlinkFailure(exc.errno or errno.EIO, str(exc))
        loop = asyncio.get_running_loop()
        firing = Firing(
            action,
            started,
            loop.create_future(),
            release_expected,
            sock=sock,
            sends=0 if sock is None else 1,
            message=message,
            made=self._made,
        )
        self._fired[action.name] = firing
        self.fired += 1
        if failure is not None:
            self._finish(firing, failure)
            return
        self._read(firing)  # the answer is queued when send() returns (see _send)
        if firing.sock is not None:  # not answered yet: it waits in the socket
            loop.add_reader(firing.sock.fileno(), self._read, firing)
            firing.watched = True
        log.debug("%s: %s sent as the event was read", action.obj, action.describe())

    def _send(self, firing: Firing) -> None:
        firing.retry = None
        sock = firing.sock
        if sock is None:
            return
        firing.sends += 1
        try:
            sock.send(firing.message)
        except OSError as exc:
            self._finish(firing, NetlinkFailure(exc.errno or errno.EIO, str(exc)))
            return
        # The kernel handles a netlink request within the send: its answer is queued
        # when send() returns. Read it now, not after a turn of the loop (~2 ms under
        # emulation: the uevents of the same removal come first), so a refusal while
        # the old device's name is released is sent again at the kernel's pace.
        self._read(firing)

    def _read(self, firing: Firing) -> None:
        """Reader callback: the kernel's answer to the add."""
        sock = firing.sock
        if sock is None:
            return
        buf = bytearray(8192)
        while True:
            try:
                data = recv_nowait(sock, buf)
            except OSError as exc:
                self._finish(firing, NetlinkFailure(exc.errno or errno.EIO, str(exc)))
                return
            if data is None:
                return
            for msg in split_messages(data):
                if msg.type != NLMSG_ERROR or msg.seq != SEQ:
                    continue
                code, text = parse_error(msg)
                if code == 0:
                    self._finish(firing, None)
                elif code in TAKEN and self._may_retry(firing):
                    when = self.clock.monotonic() + firing.pause
                    firing.pause = min(firing.pause * 2, RETRY_MAX)
                    firing.retry = self.clock.call_at(when, lambda: self._send(firing))
                else:
                    self._finish(firing, NetlinkFailure(code, text))
                return

    def _may_retry(self, firing: Firing) -> bool:
        """Only right after the kernel removed the device of that name (it is releasing
        it), for RELEASE_WAIT; otherwise a link of that name or on that netdev is really
        there, which the pass, reading the links, tells apart."""
        if not firing.release_expected:
            return False
        return self.clock.monotonic() + firing.pause - firing.started <= RELEASE_WAIT

    def _finish(self, firing: Firing, outcome: Outcome) -> None:
        if firing.retry is not None:
            firing.retry.cancel()
            firing.retry = None
        sock, firing.sock = firing.sock, None
        if sock is not None:
            loop = firing.outcome.get_loop()
            if firing.watched and not loop.is_closed():
                loop.remove_reader(sock.fileno())
            sock.close()
        if firing.outcome.done():
            return
        if outcome is None and firing.made is not None:
            try:
                firing.made(firing.action)  # the claim, before anything else runs
            except Exception:  # the pass that collects the outcome claims it too
                log.exception("%s: claiming the link the reflex made failed", firing.action.obj)
        firing.outcome.set_result(outcome)


def _request(action: AddRxe) -> bytes:
    """The RDMA netlink NEWLINK for ``action``; one sequence number will do, as each
    add has a socket of its own."""
    payload = encode(newlink_attrs(action.name, "rxe", action.netdev))
    return pack_message(nldev_type(CMD_NEWLINK), NLM_F_REQUEST | NLM_F_ACK, SEQ, payload)


def _open_rdma_socket() -> socket.socket:
    return open_request_socket(NETLINK_RDMA)
