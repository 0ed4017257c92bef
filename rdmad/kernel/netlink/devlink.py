"""devlink client: the eSwitch of SR-IOV PFs and their VF representor ports, over
generic netlink (the messages are ``devlink_codec``'s, the socket ``nlsock``'s).

devlink is core networking (not a module), so asking it never loads anything. A PF is
addressed by its devlink handle: ``pci/BDF``, or ``netdevsim/netdevsimN`` for the lab's
netdevsim devices. The family id is asked once per client (the kernel keeps it for as
long as it runs); the socket is closed after each observation and write, like the
other clients, so an idle daemon holds none.

Every request runs in a worker thread (``NetlinkTransport.request_blocking``): the
kernel runs a devlink handler inside the sender's sendmsg, under the instance's lock,
so a mode change (seconds on real NICs: every VF's vport is re-created) would stop the
event loop, and a read sent while another process changes the mode would wait behind
it. A read waits at most ``read_deadline`` (then the eSwitch is unread: unknown), a
write ``write_deadline`` with a progress line every few seconds. A thread cannot be
stopped once the kernel has its request: past its deadline the request is left to
finish, and no other request is sent until it returns (the next one says so).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable, Iterable

import msgspec

from rdmad.kernel.errors import KernelError
from rdmad.kernel.netlink.devlink_codec import (
    NETLINK_GENERIC,
    NO_ESWITCH,
    Eswitch,
    Port,
    device_dump_request,
    eswitch_get_request,
    eswitch_set_request,
    family_request,
    handle,
    parse_device,
    parse_eswitch,
    parse_family,
    parse_port,
    port_dump_request,
)
from rdmad.kernel.netlink.nlcodec import NLM_F_DUMP, NlMsg, split_messages
from rdmad.kernel.netlink.nlsock import NetlinkFailure, NetlinkTransport
from rdmad.model import EswitchObserved

NO_FAMILY = "this kernel has no devlink"
READ_DEADLINE = 10.0  # a read behind another process's mode change: then unread (unknown)
WRITE_DEADLINE = 300.0  # a mode change re-creates every VF's vport: a minute on large NICs
REPLY_WAIT = 30.0  # once the kernel has run a request, its replies are queued
PROGRESS_EVERY = 5.0  # a long write's progress line

log = logging.getLogger("rdmad.kernel")


class NoDevlink(KernelError):
    """The kernel has no devlink family (built without it): no PF has an eSwitch."""


class PfSeen(msgspec.Struct, frozen=True):
    """What devlink says about one PF: its eSwitch and its VFs' representor netdevs."""

    eswitch: EswitchObserved
    representors: dict[int, str] = msgspec.field(default_factory=dict)


class Devlink:
    """devlink for the daemon's network namespace (or a named one)."""

    def __init__(
        self,
        netns: str | None = None,
        *,
        transport: NetlinkTransport | None = None,
        read_deadline: float = READ_DEADLINE,
        write_deadline: float = WRITE_DEADLINE,
    ) -> None:
        self._nl = transport or NetlinkTransport(NETLINK_GENERIC, netns)
        self._family: int | None = None
        self.read_deadline = read_deadline
        self.write_deadline = write_deadline
        # The request in its worker thread: (its future, when it was sent, what it does).
        self._running: tuple[asyncio.Future[list[NlMsg]], float, str] | None = None

    def close(self) -> None:
        self._nl.close()

    async def _send(
        self, build: Callable[[int, int], bytes], family: int, what: str = "a read"
    ) -> list[NlMsg]:
        """A request built by the codec (for ``family``), sent in a worker thread with
        the transport's sequence numbers and acks, waited for up to its deadline."""
        running = self._running
        if running is not None and not running[0].done():
            since = time.monotonic() - running[1]
            raise NetlinkFailure(
                errno.EBUSY,
                f"an earlier devlink request ({running[2]}) has not returned after "
                f"{since:.0f} s; nothing is sent until it does",
            )
        [msg] = split_messages(build(family, 0))
        task = asyncio.ensure_future(
            asyncio.to_thread(
                self._nl.request_blocking, msg.type, msg.flags & NLM_F_DUMP, msg.data, REPLY_WAIT
            )
        )
        task.add_done_callback(_retrieve)
        started = time.monotonic()
        self._running = (task, started, what)
        writing = what != "a read"
        deadline = self.write_deadline if writing else self.read_deadline
        while True:
            left = deadline - (time.monotonic() - started)
            if left <= 0:
                raise NetlinkFailure(
                    errno.ETIMEDOUT,
                    f"devlink did not answer within {deadline:g} s (another process's "
                    "eSwitch change holds the device?); the kernel may still complete it",
                )
            done, _ = await asyncio.wait({task}, timeout=min(PROGRESS_EVERY, left))
            if done:
                return task.result()
            if writing:
                log.info("%s still in progress after %.0f s", what, time.monotonic() - started)

    async def _family_id(self) -> int:
        if self._family == 0:  # asked before: devlink is built in or not at all
            raise NoDevlink("find devlink", "", errno.ENOENT, NO_FAMILY)
        if self._family is None:
            try:
                replies = await self._send(lambda _f, seq: family_request(seq), 0)
            except NetlinkFailure as exc:
                if exc.errno == errno.ENOENT:  # the controller knows no such family
                    self._family = 0
                    raise NoDevlink("find devlink", "", errno.ENOENT, NO_FAMILY) from None
                raise
            family = parse_family(replies[0]).id if replies else 0
            if not family:  # an answer without an id: ask again next time
                raise NetlinkFailure(errno.EIO, "the controller gave no devlink family id")
            self._family = family
        return self._family

    async def _ask(
        self, op: str, target: str, build: Callable[[int, int], bytes], *, write: bool = False
    ) -> list[NlMsg]:
        try:
            family = await self._family_id()
            return await self._send(build, family, f"{op} {target}" if write else "a read")
        except (NetlinkFailure, OSError) as exc:
            code = exc.errno if exc.errno is not None else errno.EIO
            detail = exc.message if isinstance(exc, NetlinkFailure) else ""
            raise KernelError(op, target, code, detail) from None

    async def devices(self) -> set[tuple[str, str]]:
        """Every devlink instance's (bus, device)."""
        msgs = await self._ask("list devlink devices", "", device_dump_request)
        return {parse_device(m) for m in msgs}

    async def eswitch(self, bus: str, dev: str) -> Eswitch:
        msgs = await self._ask(
            "read the eSwitch", f"{bus}/{dev}", lambda f, s: eswitch_get_request(f, s, bus, dev)
        )
        if not msgs:
            raise KernelError("read the eSwitch", f"{bus}/{dev}", errno.EIO, "no reply")
        return parse_eswitch(msgs[0])

    async def ports(self, bus: str, dev: str) -> list[Port]:
        msgs = await self._ask(
            "list devlink ports", f"{bus}/{dev}", lambda f, s: port_dump_request(f, s, bus, dev)
        )
        # Kernels that do not filter the dump by device list every device's ports.
        return [p for p in map(parse_port, msgs) if (p.bus, p.dev) == (bus, dev)]

    async def set_eswitch(
        self,
        pf: str,
        mode: str | None = None,
        inline_mode: str | None = None,
        encap_mode: str | None = None,
    ) -> None:
        """``devlink dev eswitch set``: only the options given."""
        bus, dev = handle(pf)
        try:
            await self._ask(
                "set the eSwitch",
                f"{bus}/{dev}",
                lambda f, s: eswitch_set_request(f, s, bus, dev, mode, inline_mode, encap_mode),
                write=True,
            )
        finally:
            self._nl.close()

    async def read_pfs(self, pfs: Iterable[tuple[str, str | None]]) -> dict[str, PfSeen]:
        """Each PF's eSwitch and representors; ``pfs`` are (PCI address or netdevsim
        name, driver). A read that fails is ``unread`` (unknown), never "no eSwitch"."""
        pfs = list(pfs)
        if not pfs:
            return {}
        try:
            try:
                devices = await self.devices()
            except NoDevlink:
                return {pf: PfSeen(EswitchObserved(absent=NO_FAMILY)) for pf, _ in pfs}
            except KernelError as exc:
                return {pf: PfSeen(EswitchObserved(unread=str(exc))) for pf, _ in pfs}
            return {pf: await self._read_pf(pf, driver, devices) for pf, driver in pfs}
        finally:
            self._nl.close()

    async def _read_pf(self, pf: str, driver: str | None, devices: set[tuple[str, str]]) -> PfSeen:
        bus, dev = handle(pf)
        if (bus, dev) not in devices:
            who = f"{driver} registers" if driver else "no driver is bound, so there is"
            return PfSeen(EswitchObserved(absent=f"{who} no devlink instance for {pf}"))
        try:
            seen = await self.eswitch(bus, dev)
        except KernelError as exc:
            if exc.errno in NO_ESWITCH:
                return PfSeen(EswitchObserved(absent=f"{driver or 'its driver'} has none"))
            return PfSeen(EswitchObserved(unread=str(exc)))
        if seen.mode is None:
            return PfSeen(EswitchObserved(absent=f"{driver or 'its driver'} has none"))
        eswitch = EswitchObserved(seen.mode, seen.inline_mode, seen.encap_mode)
        if seen.mode != "switchdev":
            return PfSeen(eswitch)
        try:
            ports = await self.ports(bus, dev)
        except KernelError:
            return PfSeen(eswitch)  # representors are shown, never decided on
        reps = {
            p.vf_number: p.netdev
            for p in ports
            if p.flavour == "pcivf" and p.vf_number is not None and p.netdev
        }
        return PfSeen(eswitch, reps)


def _retrieve(task: asyncio.Future[list[NlMsg]]) -> None:
    """A request left past its deadline ends unseen: its failure is not an error here
    (the next observation shows what the kernel did)."""
    if not task.cancelled():
        task.exception()
