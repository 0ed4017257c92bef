"""RDMA netlink (NETLINK_RDMA, the "nldev" client): list RDMA links, add and delete rxe links.

Hand-written because pyroute2 has no RDMA family. The messages are pyroute2 ``nlmsg``
subclasses (``NldevMsg``: no fixed header, only attributes, numbered as in the kernel's
``include/uapi/rdma/rdma_netlink.h``); they travel over the same small asyncio netlink
transport as ``rdmad.kernel.netlink`` (non-blocking socket + ``loop.add_reader``), so
nothing runs in a thread. Requests are tiny and answered at once.

Facts this relies on (kernel 6.1+):

* The message type is ``RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, op) = (5 << 10) + op``.
* Command numbers: GET 1, SET 2, NEWLINK 3, DELLINK 4, PORT_GET 5, GET_CHARDEV 15.
* DELLINK wants the device index, not its name; only devices flagged
  IBK_ALLOW_USER_UNREG (rxe, siw) may be deleted, others answer EINVAL.
* GET does not name the driver. GET_CHARDEV for "uverbs" answers with
  RDMA_NLDEV_ATTR_UVERBS_DRIVER_ID (``enum rdma_driver_id``, rxe = 14). The kernel
  auto-loads ib_uverbs for that query (``MODULE_ALIAS_RDMA_CLIENT("uverbs")``).
  When it cannot answer, ``driver`` is None (sysfs ``/sys/class/infiniband/DEV/parent``
  exists only for rxe and is the fallback for ``rdmad.kernel.observe``).
* Opening a NETLINK_RDMA socket auto-loads ib_core; a kernel without InfiniBand support
  answers EPROTONOSUPPORT, and then ``available()`` is False with the reason.
"""

from __future__ import annotations

import errno
import socket
import struct
from typing import Any

from rdmad.kernel.errors import KernelError
from rdmad.kernel.netlink import (
    NLM_F_DUMP,
    NetlinkFailure,
    NetlinkTransport,
    NlMsg,
    own_nla_table,
)
from rdmad.kernel.pyroute2_lean import nlmsg
from rdmad.model import RdmaLinkObserved

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5

CMD_GET = 1
CMD_SET = 2
CMD_NEWLINK = 3
CMD_DELLINK = 4
CMD_PORT_GET = 5
CMD_GET_CHARDEV = 15

ATTR_DEV_INDEX = 1
ATTR_DEV_NAME = 2
ATTR_PORT_INDEX = 3
ATTR_PORT_STATE = 12
ATTR_PORT_PHYS_STATE = 13
ATTR_NDEV_INDEX = 50
ATTR_NDEV_NAME = 51
ATTR_LINK_TYPE = 65
ATTR_DEV_PROTOCOL = 67
ATTR_CHARDEV_TYPE = 69
ATTR_CHARDEV_NAME = 70
ATTR_UVERBS_DRIVER_ID = 73

# enum rdma_driver_id (include/uapi/rdma/ib_user_ioctl_verbs.h)
DRIVER_NAMES = {
    1: "mlx5",
    2: "mlx4",
    3: "cxgb3",
    4: "cxgb4",
    5: "mthca",
    6: "bnxt_re",
    7: "ocrdma",
    8: "nes",
    9: "irdma",
    10: "vmw_pvrdma",
    11: "qedr",
    12: "hns",
    13: "usnic",
    14: "rxe",
    15: "hfi1",
    16: "qib",
    17: "efa",
    18: "siw",
    19: "erdma",
    20: "mana",
}


def nldev_type(op: int) -> int:
    """RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, op)."""
    return (RDMA_NL_NLDEV << 10) + op


@own_nla_table
class NldevMsg(nlmsg):  # type: ignore[misc]
    """An nldev message: the netlink header, then attributes (no family header)."""

    prefix = "RDMA_NLDEV_ATTR_"
    fields = ()
    nla_map = (
        (ATTR_DEV_INDEX, "RDMA_NLDEV_ATTR_DEV_INDEX", "uint32"),
        (ATTR_DEV_NAME, "RDMA_NLDEV_ATTR_DEV_NAME", "asciiz"),
        (ATTR_PORT_INDEX, "RDMA_NLDEV_ATTR_PORT_INDEX", "uint32"),
        (ATTR_PORT_STATE, "RDMA_NLDEV_ATTR_PORT_STATE", "uint8"),
        (ATTR_PORT_PHYS_STATE, "RDMA_NLDEV_ATTR_PORT_PHYS_STATE", "uint8"),
        (ATTR_NDEV_INDEX, "RDMA_NLDEV_ATTR_NDEV_INDEX", "uint32"),
        (ATTR_NDEV_NAME, "RDMA_NLDEV_ATTR_NDEV_NAME", "asciiz"),
        (ATTR_LINK_TYPE, "RDMA_NLDEV_ATTR_LINK_TYPE", "asciiz"),
        (ATTR_DEV_PROTOCOL, "RDMA_NLDEV_ATTR_DEV_PROTOCOL", "asciiz"),
        (ATTR_CHARDEV_TYPE, "RDMA_NLDEV_ATTR_CHARDEV_TYPE", "asciiz"),
        (ATTR_CHARDEV_NAME, "RDMA_NLDEV_ATTR_CHARDEV_NAME", "asciiz"),
        (ATTR_UVERBS_DRIVER_ID, "RDMA_NLDEV_ATTR_UVERBS_DRIVER_ID", "uint32"),
    )


def encode(op: int, attrs: list[tuple[str, Any]], flags: int = 0) -> bytes:
    """A complete nldev message (header included); the transport re-writes the header."""
    msg = NldevMsg()
    msg["header"]["type"] = nldev_type(op)
    msg["header"]["flags"] = flags
    msg["attrs"] = attrs
    msg.encode()
    return bytes(msg.data)


def payload(op: int, attrs: list[tuple[str, Any]]) -> bytes:
    return encode(op, attrs)[16:]


def decode(data: bytes) -> NldevMsg:
    """Decode a complete nldev message (header included)."""
    msg = NldevMsg(data)
    msg.decode()
    return msg


def decode_reply(reply: NlMsg) -> NldevMsg:
    header = struct.pack("=IHHII", 16 + len(reply.data), reply.type, reply.flags, reply.seq, 0)
    return decode(header + reply.data)


def newlink_attrs(name: str, link_type: str, netdev: str) -> list[tuple[str, Any]]:
    return [
        ("RDMA_NLDEV_ATTR_DEV_NAME", name),
        ("RDMA_NLDEV_ATTR_LINK_TYPE", link_type),
        ("RDMA_NLDEV_ATTR_NDEV_NAME", netdev),
    ]


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


class RdmaNetlink:
    """nldev client for the daemon's network namespace (or a named one)."""

    def __init__(self, netns: str | None = None) -> None:
        self._nl = NetlinkTransport(NETLINK_RDMA, netns)
        self.reason: str | None = None  # why available() is False

    def close(self) -> None:
        self._nl.close()

    def available(self) -> bool:
        """True when the kernel speaks NETLINK_RDMA; otherwise ``reason`` says why."""
        try:
            self._nl.get_socket()
        except OSError as exc:
            if exc.errno == errno.EPROTONOSUPPORT:
                self.reason = (
                    "the kernel has no RDMA netlink (NETLINK_RDMA): "
                    "InfiniBand core (ib_core) is not built or cannot be loaded"
                )
            else:
                self.reason = f"cannot open an RDMA netlink socket: {exc.strerror or exc}"
            return False
        self.reason = None
        return True

    async def _request(self, op: int, attrs: list[tuple[str, Any]], flags: int = 0) -> list[Any]:
        replies = await self._nl.request(nldev_type(op), flags, payload(op, attrs))
        # Any nldev reply counts: the kernel answers PORT_GET with a message typed
        # CMD_GET (nldev_port_get_doit), so matching on the request's type loses it.
        return [decode_reply(r) for r in replies if r.type >> 10 == RDMA_NL_NLDEV]

    async def devices(self) -> list[tuple[int, str]]:
        """(index, name) of every RDMA device."""
        try:
            msgs = await self._request(CMD_GET, [], NLM_F_DUMP)
        except (NetlinkFailure, OSError) as exc:
            raise _error("list RDMA devices", "", exc) from None
        return [
            (m.get_attr("RDMA_NLDEV_ATTR_DEV_INDEX"), m.get_attr("RDMA_NLDEV_ATTR_DEV_NAME"))
            for m in msgs
        ]

    async def links(self) -> list[RdmaLinkObserved]:
        """Every RDMA device with port 1's netdev and its driver (None when unknown)."""
        out = []
        for index, name in await self.devices():
            netdev, ifindex = await self._port_netdev(index)
            out.append(
                RdmaLinkObserved(
                    name=name,
                    driver=await self._driver(index),
                    netdev=netdev,
                    netdev_ifindex=ifindex,
                )
            )
        return out

    async def _port_netdev(self, index: int) -> tuple[str | None, int | None]:
        attrs = [("RDMA_NLDEV_ATTR_DEV_INDEX", index), ("RDMA_NLDEV_ATTR_PORT_INDEX", 1)]
        try:
            msgs = await self._request(CMD_PORT_GET, attrs)
        except (NetlinkFailure, OSError):
            return None, None  # device went away between the dump and this query
        for m in msgs:
            return m.get_attr("RDMA_NLDEV_ATTR_NDEV_NAME"), m.get_attr("RDMA_NLDEV_ATTR_NDEV_INDEX")
        return None, None

    async def _driver(self, index: int) -> str | None:
        attrs = [("RDMA_NLDEV_ATTR_DEV_INDEX", index), ("RDMA_NLDEV_ATTR_CHARDEV_TYPE", "uverbs")]
        try:
            msgs = await self._request(CMD_GET_CHARDEV, attrs)
        except (NetlinkFailure, OSError):
            return None
        for m in msgs:
            driver_id = m.get_attr("RDMA_NLDEV_ATTR_UVERBS_DRIVER_ID")
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

    async def delete_link(self, name: str) -> None:
        """``rdma link delete NAME``: looks the device index up by name, then DELLINK."""
        op = f"delete RDMA link {name}"
        index = next((i for i, n in await self.devices() if n == name), None)
        if index is None:
            raise KernelError(op, "", errno.ENODEV, "no RDMA device of that name")
        try:
            await self._request(CMD_DELLINK, [("RDMA_NLDEV_ATTR_DEV_INDEX", index)])
        except (NetlinkFailure, OSError) as exc:
            raise _error(op, "", exc, _DEL_HINTS) from None


def _error(
    op: str, target: str, exc: NetlinkFailure | OSError, hints: dict[int, str] | None = None
) -> KernelError:
    code = exc.errno if exc.errno is not None else errno.EIO
    detail = [exc.message] if isinstance(exc, NetlinkFailure) and exc.message else []
    if hints and code in hints:
        detail.append(hints[code])
    return KernelError(op, target, code, "; ".join(detail))


def socket_family_available() -> bool:
    """Cheap probe without keeping a socket: does this kernel know NETLINK_RDMA?"""
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA).close()
    except OSError:
        return False
    return True
