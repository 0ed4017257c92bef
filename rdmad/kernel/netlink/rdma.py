"""RDMA netlink (NETLINK_RDMA, the "nldev" client): RDMA links and their users; rxe add/delete.

Requests travel over the shared asyncio transport (``nlsock``); messages are encoded and
decoded by ``rdma_codec``, users derived by ``rdma_usage``. Nothing runs in a thread.

Observing never loads a kernel module. Opening a NETLINK_RDMA socket makes the kernel
load ib_core (see ``available()``), and a GET_CHARDEV query for "uverbs" loads ib_uverbs
(``MODULE_ALIAS_RDMA_CLIENT``). So the socket is opened only once ``/sys/module/ib_core``
exists (an RDMA device cannot exist without it), and the driver is asked for only once
``/sys/module/ib_uverbs`` exists; otherwise ``driver`` is None and ``observe`` falls back
to sysfs (``/sys/class/infiniband/DEV/parent`` exists for rxe). ``add_link`` may load
modules: it is a requested change, not an observation.

The socket lives for one operation (``links``, ``add_link``, ``delete_link``, the probe in
``available``) and is closed after it: a user NETLINK_RDMA socket holds a reference on
ib_core (the module that registered the netlink family, ``netlink_create``'s
``try_module_get``), so a socket kept open would make every `modprobe -r ib_core` (an
openibd stop, a guarded stack stop) fail with "Module ib_core is in use".

Other facts (kernel 6.1+): DELLINK wants the device index, not its name; only devices
flagged IBK_ALLOW_USER_UNREG (rxe, siw) may be deleted, others answer EINVAL. A kernel
without InfiniBand support answers EPROTONOSUPPORT to the socket.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Literal

from rdmad.kernel.errors import KernelError
from rdmad.kernel.netlink.nlcodec import NLM_F_DUMP, NlMsg
from rdmad.kernel.netlink.nlsock import NetlinkFailure, NetlinkTransport
from rdmad.kernel.netlink.rdma_codec import (
    ATTR_CHARDEV_TYPE,
    ATTR_DEV_INDEX,
    ATTR_DEV_NAME,
    ATTR_NDEV_INDEX,
    ATTR_NDEV_NAME,
    ATTR_PORT_INDEX,
    ATTR_PORT_STATE,
    ATTR_UVERBS_DRIVER_ID,
    CMD_DELLINK,
    CMD_GET,
    CMD_GET_CHARDEV,
    CMD_NEWLINK,
    CMD_PORT_GET,
    CMD_RES_GET,
    CMD_SYS_SET,
    DRIVER_NAMES,
    NETLINK_RDMA,
    PORT_STATES,
    RES_TABLES,
    NldevAttrs,
    ResObject,
    Value,
    decode_res,
    decode_summary,
    encode,
    encode_netns_mode,
    is_nldev,
    newlink_attrs,
    nldev_type,
)
from rdmad.kernel.netlink.rdma_usage import device_usage, usage_of
from rdmad.kernel.sysfs import Sysfs
from rdmad.model.shared_observed import RdmaLinkObserved, Usage

_ADD_HINTS = {
    errno.EEXIST: "an RDMA device of that name exists, or the netdev already has an rxe link",
    errno.ENFILE: "an RDMA device of that name exists",
    errno.ENODEV: "the netdev does not exist",
    errno.EINVAL: "unknown link type, or its module (rdma_rxe) cannot be loaded",
}
_DEL_HINTS = {
    errno.EINVAL: "only software links (rxe, siw) can be deleted",
    errno.ENODEV: "no such RDMA device",
}
_NETNS_HINTS = {
    errno.EBUSY: (
        "a network namespace besides the host's exists (a container, `ip netns`, a unit "
        "with PrivateNetwork=): the mode changes only without one, or at ib_core's next load"
    ),
    errno.EPERM: "needs CAP_NET_ADMIN in the host's user namespace",
}
NO_IB_CORE = "the running kernel has no InfiniBand core (ib_core): no RDMA netlink, no rxe"


class RdmaNetlink:
    """nldev client for the daemon's network namespace (or a named one).

    ``root`` is where ``sys/module`` and ``proc`` are read (tests pass a tree).
    """

    def __init__(self, netns: str | None = None, *, root: str | os.PathLike[str] = "/") -> None:
        self._nl = NetlinkTransport(NETLINK_RDMA, netns)
        self._sysfs = Sysfs(root)
        self.reason: str | None = None  # why available() is False
        # Whether that answer lasts (no ib_core, no NETLINK_RDMA in this kernel) or may be
        # gone at the next try (out of descriptors, memory): only a lasting one is cached.
        self.lasting = True
        self._seen: dict[str, _Seen] = {}  # last detailed resource read, by device

    def close(self) -> None:
        self._nl.close()

    def _core_loaded(self) -> bool:
        return self._sysfs.exists("sys/module/ib_core")

    def available(self) -> bool:
        """Whether this kernel can have RDMA netlink (rxe links can be created); else
        ``reason`` says why. Never loads a module.

        * ib_core loaded: the socket is opened (the kernel loads nothing);
          EPROTONOSUPPORT or another error gives False.
        * ib_core not loaded: no socket is opened. True while the running kernel ships
          ib_core (modules.dep or modules.builtin name it, or they cannot be read):
          there are no RDMA devices yet, ``links()`` is empty, and ``add_link`` will
          make the kernel load what it needs. False when the kernel has no ib_core.
        """
        if not self._core_loaded():
            shipped = self._core_shipped()
            self.reason, self.lasting = (None if shipped else NO_IB_CORE), True
            return shipped
        try:
            self._nl.get_socket()
            self._nl.close()  # a probe: the socket pins ib_core while open
        except OSError as exc:
            self.lasting = exc.errno == errno.EPROTONOSUPPORT
            if self.lasting:
                self.reason = "the kernel has no RDMA netlink (NETLINK_RDMA)"
            else:
                self.reason = f"cannot open an RDMA netlink socket: {exc.strerror or exc}"
            return False
        self.reason, self.lasting = None, True
        return True

    def _core_shipped(self) -> bool:
        """Whether the running kernel has ib_core as a module or built in (None: can't tell)."""
        base = f"lib/modules/{os.uname().release}"
        listed = [self._sysfs.read(f"{base}/{name}") for name in ("modules.dep", "modules.builtin")]
        if all(text is None for text in listed):
            return True  # cannot tell: let add_link get the kernel's own answer
        return any(text is not None and "/ib_core.ko" in text for text in listed)

    async def _request(
        self, op: int, attrs: list[tuple[int, Value]], flags: int = 0
    ) -> list[NlMsg]:
        replies = await self._nl.request(nldev_type(op), flags, encode(attrs))
        return [r for r in replies if is_nldev(r)]

    async def devices(self) -> list[tuple[int, str]]:
        """(index, name) of every RDMA device; none while ib_core is not loaded."""
        if not self._core_loaded():
            return []
        try:
            msgs = await self._request(CMD_GET, [], NLM_F_DUMP)
        except (NetlinkFailure, OSError) as exc:
            raise _error("list RDMA devices", "", exc) from None
        out = []
        for m in msgs:
            a = NldevAttrs.of(m)
            index, name = a.uint(ATTR_DEV_INDEX), a.text(ATTR_DEV_NAME)
            if index is not None and name is not None:
                out.append((index, name))
        return out

    async def links(self) -> list[RdmaLinkObserved]:
        """Every RDMA device with port 1's netdev, its driver (None when unknown) and users.

        ``usage`` is what the kernel's resource tracking shows beyond ib_core's own
        objects (see ``rdma_usage``); UNKNOWN with the reason when it cannot be read.
        """
        try:
            return await self._links()
        finally:
            self._nl.close()  # an open socket pins ib_core

    async def _links(self) -> list[RdmaLinkObserved]:
        devices = await self.devices()
        if not devices:
            return []  # also: no socket while ib_core is not loaded
        usage = await self._usage(devices)
        out = []
        for index, name in devices:
            netdev, ifindex, state = await self._port(index)
            driver = await self._driver(index)
            out.append(
                RdmaLinkObserved(
                    name=name,
                    driver=driver,
                    netdev=netdev,
                    netdev_ifindex=ifindex,
                    usage=usage[name],
                    port_state=state,
                    # Whether the link can be addressed at all (reconcile.rxe): for rxe only.
                    gids=self._sysfs.ib_gids(name) if self._is_rxe(name, driver) else None,
                )
            )
        return out

    async def _usage(self, devices: list[tuple[int, str]]) -> dict[str, Usage]:
        """Usage of each device, cheaply: one RES_GET dump counts every device's objects.

        The kernel lists a device's QPs/CQs/PDs (and so their owners) only one device per
        dump; those dumps run for a device only when its counts differ from the last
        time they were read, or a process seen holding it then is gone.
        """
        try:
            msgs = await self._request(CMD_RES_GET, [], NLM_F_DUMP)
            summaries = {s.dev_index: s.key() for s in map(decode_summary, msgs)}
        except (NetlinkFailure, OSError):
            summaries = {}
        out: dict[str, Usage] = {}
        cache: dict[str, _Seen] = {}
        for index, name in devices:
            seen = self._seen.get(name)
            if seen is not None and seen.still(index, summaries.get(index), self._sysfs):
                out[name], cache[name] = seen.usage, seen
                continue
            objects, failed = await self._resources(index)
            out[name] = usage_of(name, device_usage(objects, self._comm), failed)
            if failed is None:
                cache[name] = _Seen.of(index, objects, out[name])
        self._seen = cache
        return out

    async def resources(self, index: int) -> list[ResObject]:
        """The QPs, CQs and PDs of one device (one dump each); raises KernelError."""
        objects: list[ResObject] = []
        kinds: tuple[Literal["qp", "cq", "pd"], ...] = ("qp", "cq", "pd")
        for kind in kinds:
            cmd = RES_TABLES[kind][0]
            try:
                msgs = await self._request(cmd, [(ATTR_DEV_INDEX, index)], NLM_F_DUMP)
            except (NetlinkFailure, OSError) as exc:
                raise _error(f"list RDMA {kind}s", f"device {index}", exc) from None
            for m in msgs:
                objects.extend(decode_res(kind, m))
        return objects

    async def _resources(self, index: int) -> tuple[list[ResObject], str | None]:
        try:
            return await self.resources(index), None
        except KernelError as exc:
            return [], str(exc)

    def _comm(self, pid: int) -> str | None:
        return self._sysfs.read(f"proc/{pid}/comm")

    async def _port(self, index: int) -> tuple[str | None, int | None, str | None]:
        """Port 1's netdev (name, ifindex) and state, from one PORT_GET."""
        attrs: list[tuple[int, Value]] = [(ATTR_DEV_INDEX, index), (ATTR_PORT_INDEX, 1)]
        try:
            msgs = await self._request(CMD_PORT_GET, attrs)
        except (NetlinkFailure, OSError):
            return None, None, None  # device went away between the dump and this query
        for m in msgs:
            a = NldevAttrs.of(m)
            state = a.uint(ATTR_PORT_STATE)
            name = None
            if state is not None:
                name = PORT_STATES[state] if state < len(PORT_STATES) else str(state)
            return a.text(ATTR_NDEV_NAME), a.uint(ATTR_NDEV_INDEX), name
        return None, None, None

    def _is_rxe(self, name: str, driver: str | None) -> bool:
        return (driver or self._sysfs.ib_driver(name)) == "rxe"

    async def _driver(self, index: int) -> str | None:
        if not self._sysfs.exists("sys/module/ib_uverbs"):
            return None  # asking would make the kernel load ib_uverbs
        attrs: list[tuple[int, Value]] = [(ATTR_DEV_INDEX, index), (ATTR_CHARDEV_TYPE, "uverbs")]
        try:
            msgs = await self._request(CMD_GET_CHARDEV, attrs)
        except (NetlinkFailure, OSError):
            return None
        for m in msgs:
            driver_id = NldevAttrs.of(m).uint(ATTR_UVERBS_DRIVER_ID)
            if driver_id is not None:
                return DRIVER_NAMES.get(driver_id, f"driver-id-{driver_id}")
        return None

    async def add_link(self, name: str, link_type: str, netdev: str) -> None:
        """``rdma link add NAME type LINK_TYPE netdev NETDEV``."""
        op = f"add {link_type} link {name}"
        try:
            await self._request(CMD_NEWLINK, newlink_attrs(name, link_type, netdev))
        except (NetlinkFailure, OSError) as exc:
            raise _error(op, f"netdev {netdev}", exc, _ADD_HINTS) from None
        finally:
            self._nl.close()

    async def delete_link(self, name: str) -> None:
        """``rdma link delete NAME``: looks the device index up by name, then DELLINK."""
        op = f"delete RDMA link {name}"
        try:
            index = next((i for i, n in await self.devices() if n == name), None)
            if index is None:
                raise KernelError(op, "", errno.ENODEV, "no RDMA device of that name")
            await self._request(CMD_DELLINK, [(ATTR_DEV_INDEX, index)])
        except (NetlinkFailure, OSError) as exc:
            raise _error(op, "", exc, _DEL_HINTS) from None
        finally:
            self._nl.close()

    async def set_netns_mode(self, mode: str) -> None:
        """``rdma system set netns MODE`` ("shared" or "exclusive")."""
        op = f"set the RDMA netns mode {mode}"
        try:
            await self._nl.request(nldev_type(CMD_SYS_SET), 0, encode_netns_mode(mode))
        except (NetlinkFailure, OSError) as exc:
            raise _error(op, "", exc, _NETNS_HINTS) from None
        finally:
            self._nl.close()


@dataclass(frozen=True, slots=True)
class _Seen:
    """A device's usage as last read in detail, and what it was read from."""

    index: int
    counts: tuple[int, ...]  # QPs, CQs, PDs, as RES_TABLES orders them
    pids: frozenset[int]
    usage: Usage

    @classmethod
    def of(cls, index: int, objects: list[ResObject], usage: Usage) -> _Seen:
        counts = tuple(sum(1 for o in objects if o.kind == kind) for kind in RES_TABLES)
        pids = frozenset(o.pid for o in objects if o.pid is not None)
        return cls(index, counts, pids, usage)

    def still(self, index: int, counts: tuple[int, ...] | None, sysfs: Sysfs) -> bool:
        """Whether nothing that decides usage can have changed since."""
        if index != self.index or counts != self.counts:
            return False
        return all(sysfs.exists(f"proc/{pid}") for pid in self.pids)


def _error(
    op: str, target: str, exc: NetlinkFailure | OSError, hints: dict[int, str] | None = None
) -> KernelError:
    code = exc.errno if exc.errno is not None else errno.EIO
    detail = [exc.message] if isinstance(exc, NetlinkFailure) and exc.message else []
    if hints and code in hints:
        detail.append(hints[code])
    return KernelError(op, target, code, "; ".join(detail))
