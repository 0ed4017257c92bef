"""RDMA netlink ("nldev") messages: requests encoded, replies decoded. No sockets.

Hand-written with ``struct`` because no library speaks nldev (pyroute2 has no RDMA
family): the messages are a netlink header and flat u32/string attributes numbered as
in the kernel's ``include/uapi/rdma/rdma_netlink.h``, with nested tables only in the
resource-tracking replies (RES_*_GET). The tests pin the bytes and round-trip them.

Facts this relies on (kernel 6.1+):

* The message type is ``RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, op) = (5 << 10) + op``.
* The RES_QP/CQ/PD dumps need RDMA_NLDEV_ATTR_DEV_INDEX (one device per dump; the
  kernel answers EINVAL without it). Each object carries its owner:
  RDMA_NLDEV_ATTR_RES_PID for a process, or RDMA_NLDEV_ATTR_RES_KERN_NAME (the module
  that created it) for the kernel. RES_GET without an index dumps every device's
  object counts (RDMA_NLDEV_ATTR_RES_SUMMARY) in one go.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

from rdmad.kernel.netlink.nlcodec import (
    NlMsg,
    asciiz,
    attr,
    cstr,
    get_uint,
    iter_attrs,
    u8,
    u32,
)

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5

# enum rdma_nldev_command
CMD_GET = 1
CMD_SET = 2
CMD_NEWLINK = 3
CMD_DELLINK = 4
CMD_PORT_GET = 5
CMD_SYS_GET = 6
CMD_SYS_SET = 7
CMD_RES_GET = 9
CMD_RES_QP_GET = 10
CMD_RES_CQ_GET = 12
CMD_RES_PD_GET = 14
CMD_GET_CHARDEV = 15

# enum rdma_nldev_attr
ATTR_DEV_INDEX = 1
ATTR_DEV_NAME = 2
ATTR_PORT_INDEX = 3
ATTR_PORT_STATE = 12
ATTR_PORT_PHYS_STATE = 13
# enum ib_port_state (rdma/ib_verbs.h), as `rdma link` and sysfs name them.
PORT_STATES = ("NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")
ATTR_RES_SUMMARY = 15
ATTR_RES_SUMMARY_ENTRY = 16
ATTR_RES_SUMMARY_ENTRY_NAME = 17
ATTR_RES_SUMMARY_ENTRY_CURR = 18
ATTR_RES_QP = 19
ATTR_RES_QP_ENTRY = 20
ATTR_RES_LQPN = 21
ATTR_RES_TYPE = 26
ATTR_RES_PID = 28
ATTR_RES_KERN_NAME = 29
ATTR_RES_CQ = 35
ATTR_RES_CQ_ENTRY = 36
ATTR_RES_PD = 46
ATTR_RES_PD_ENTRY = 47
ATTR_NDEV_INDEX = 50
ATTR_NDEV_NAME = 51
ATTR_LINK_TYPE = 65
ATTR_DEV_PROTOCOL = 67
ATTR_CHARDEV_TYPE = 69
ATTR_CHARDEV_NAME = 70
ATTR_UVERBS_DRIVER_ID = 73
# The RDMA subsystem's network namespace mode (`rdma system set netns shared|exclusive`):
# a u8 (the kernel's policy refuses a u32), 0 exclusive, 1 shared.
SYS_ATTR_NETNS_MODE = 66
NETNS_MODES = ("exclusive", "shared")

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

ResKind = Literal["qp", "cq", "pd"]
# kind -> (dump command, table attribute, entry attribute)
RES_TABLES: dict[ResKind, tuple[int, int, int]] = {
    "qp": (CMD_RES_QP_GET, ATTR_RES_QP, ATTR_RES_QP_ENTRY),
    "cq": (CMD_RES_CQ_GET, ATTR_RES_CQ, ATTR_RES_CQ_ENTRY),
    "pd": (CMD_RES_PD_GET, ATTR_RES_PD, ATTR_RES_PD_ENTRY),
}

Value = int | str


def nldev_type(op: int) -> int:
    """RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, op)."""
    return (RDMA_NL_NLDEV << 10) + op


def encode(attrs: Sequence[tuple[int, Value]]) -> bytes:
    """An nldev request payload (no family header): ints as u32, strings NUL-terminated."""
    return b"".join(
        attr(atype, u32(value) if isinstance(value, int) else asciiz(value))
        for atype, value in attrs
    )


def newlink_attrs(name: str, link_type: str, netdev: str) -> list[tuple[int, Value]]:
    return [(ATTR_DEV_NAME, name), (ATTR_LINK_TYPE, link_type), (ATTR_NDEV_NAME, netdev)]


class NldevAttrs(NamedTuple):
    """The top-level attributes of one nldev reply, read by number."""

    raw: dict[int, bytes]

    @classmethod
    def of(cls, reply: NlMsg) -> NldevAttrs:
        return cls(dict(iter_attrs(reply.data)))

    def uint(self, atype: int) -> int | None:
        return get_uint(self.raw[atype]) if atype in self.raw else None

    def text(self, atype: int) -> str | None:
        return cstr(self.raw[atype]) if atype in self.raw else None


def is_nldev(reply: NlMsg) -> bool:
    # Any nldev reply counts: the kernel answers PORT_GET with a message typed
    # CMD_GET (nldev_port_get_doit), so matching on the request's type loses it.
    return reply.type >> 10 == RDMA_NL_NLDEV


class ResObject(NamedTuple):
    """One tracked RDMA object (QP, CQ, PD) and who owns it."""

    kind: ResKind
    dev_index: int
    dev_name: str
    pid: int | None  # the owning process (user space)
    kern_name: str | None  # the owning kernel module (kernel object)
    qpn: int | None = None  # the local QP number (QPs only)


def decode_res(kind: ResKind, reply: NlMsg) -> list[ResObject]:
    """The objects of one RES_*_GET dump part."""
    _cmd, table, entry_type = RES_TABLES[kind]
    top = NldevAttrs.of(reply)
    dev_index = top.uint(ATTR_DEV_INDEX) or 0
    dev_name = top.text(ATTR_DEV_NAME) or ""
    out = []
    for etype, entry in iter_attrs(top.raw.get(table, b"")):
        if etype != entry_type:
            continue
        fields = NldevAttrs(dict(iter_attrs(entry)))
        out.append(
            ResObject(
                kind,
                dev_index,
                dev_name,
                pid=fields.uint(ATTR_RES_PID),
                kern_name=fields.text(ATTR_RES_KERN_NAME),
                qpn=fields.uint(ATTR_RES_LQPN),
            )
        )
    return out


class ResSummary(NamedTuple):
    """One device's object counts by type ("qp", "cq", "pd", "mr", ...) from RES_GET."""

    dev_index: int
    dev_name: str
    counts: dict[str, int]

    def key(self) -> tuple[int, ...]:
        """The counts that decide usage (QPs, CQs, PDs), comparable between passes."""
        return tuple(self.counts.get(kind, 0) for kind in RES_TABLES)


def decode_summary(reply: NlMsg) -> ResSummary:
    top = NldevAttrs.of(reply)
    counts: dict[str, int] = {}
    for etype, entry in iter_attrs(top.raw.get(ATTR_RES_SUMMARY, b"")):
        if etype != ATTR_RES_SUMMARY_ENTRY:
            continue
        fields = NldevAttrs(dict(iter_attrs(entry)))
        name = fields.text(ATTR_RES_SUMMARY_ENTRY_NAME)
        if name is not None:
            counts[name] = fields.uint(ATTR_RES_SUMMARY_ENTRY_CURR) or 0
    return ResSummary(top.uint(ATTR_DEV_INDEX) or 0, top.text(ATTR_DEV_NAME) or "", counts)


def encode_netns_mode(mode: str) -> bytes:
    """The SYS_SET payload of `rdma system set netns MODE`; ValueError for another name."""
    return attr(SYS_ATTR_NETNS_MODE, u8(NETNS_MODES.index(mode)))


def decode_netns_mode(reply: NlMsg) -> str | None:
    """The mode a SYS_GET reply names; None when the kernel sent none."""
    for atype, value in iter_attrs(reply.data):
        if atype == SYS_ATTR_NETNS_MODE:
            number = get_uint(value)
            return NETNS_MODES[number] if number < len(NETNS_MODES) else f"unknown({number})"
    return None
