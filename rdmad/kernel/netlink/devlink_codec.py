"""devlink messages over generic netlink: requests encoded, replies decoded. No sockets.

What rdmad reads and sets through devlink (``devlink dev eswitch``, ``devlink port``):
a PF's eSwitch mode (legacy | switchdev) with its inline and encap modes, the ports of
a device (the VF representors in switchdev mode: flavour pcivf, the VF's number, the
representor's netdev) and a VF port's function (its hw_addr: the VF's MAC on mlx5 in
switchdev mode, where `ip link set PF vf N mac` no longer applies).

Hand-written with ``struct`` on the framing of ``nlcodec``, as rtnetlink and nldev are:
pyroute2 has a devlink family, but importing it costs more than rdmad's whole kernel
layer (``nlcodec``'s docstring), and rdmad needs five commands of it. The tests check
these messages against pyroute2's devlink decoder and its encoder against these
decoders. Numbers from the kernel's ``include/uapi/linux/devlink.h`` and
``genetlink.h`` (6.1; unchanged since: the uapi enums only grow).

Generic netlink: the devlink family's id is not fixed; ``family_request`` asks the
controller (GENL_ID_CTRL) for it and for its multicast group ``config``, on which the
kernel announces eswitch and port changes (``DEVLINK_CMD_PORT_NEW`` / ``_DEL`` when
representors come and go). Every message carries the 4-byte genlmsghdr (cmd, version).
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass
from typing import NamedTuple

from rdmad.kernel.netlink.nlcodec import (
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NlMsg,
    asciiz,
    attr,
    cstr,
    get_uint,
    iter_attrs,
    nested,
    pack_message,
    u32,
)

NETLINK_GENERIC = 16
GENL_HEADER = struct.Struct("=BBH")  # struct genlmsghdr: cmd, version, reserved

# linux/genetlink.h: the controller
GENL_ID_CTRL = 16
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
CTRL_ATTR_MCAST_GROUPS = 7
CTRL_ATTR_MCAST_GRP_NAME = 1
CTRL_ATTR_MCAST_GRP_ID = 2

# linux/devlink.h
FAMILY = "devlink"
MCAST_CONFIG = "config"
VERSION = 1
CMD_GET = 1
CMD_NEW = 3
CMD_DEL = 4
CMD_PORT_GET = 5
CMD_PORT_SET = 6
CMD_PORT_NEW = 7
CMD_PORT_DEL = 8
CMD_ESWITCH_GET = 29
CMD_ESWITCH_SET = 30

ATTR_BUS_NAME = 1
ATTR_DEV_NAME = 2
ATTR_PORT_INDEX = 3
ATTR_PORT_NETDEV_IFINDEX = 6
ATTR_PORT_NETDEV_NAME = 7
ATTR_ESWITCH_MODE = 25  # u16
ATTR_ESWITCH_INLINE_MODE = 26  # u8
ATTR_ESWITCH_ENCAP_MODE = 62  # u8
ATTR_PORT_FLAVOUR = 77  # u16
ATTR_PORT_PCI_PF_NUMBER = 127  # u16
ATTR_PORT_PCI_VF_NUMBER = 128  # u16
ATTR_PORT_FUNCTION = 145  # nested
PORT_FUNCTION_ATTR_HW_ADDR = 1  # binary
PORT_FN_ATTR_STATE = 2  # u8
PORT_FN_ATTR_OPSTATE = 3  # u8

ESWITCH_MODES = ("legacy", "switchdev")  # index = DEVLINK_ESWITCH_MODE_*
INLINE_MODES = ("none", "link", "network", "transport")
ENCAP_MODES = ("none", "basic")
# enum devlink_port_flavour, as `devlink port` names them
FLAVOURS = {
    0: "physical",
    1: "cpu",
    2: "dsa",
    3: "pcipf",
    4: "pcivf",
    5: "virtual",
    6: "unused",
    7: "pcisf",
}
FN_STATES = ("inactive", "active")
FN_OPSTATES = ("detached", "attached")


class Family(NamedTuple):
    id: int
    mcast_groups: dict[str, int]


class Eswitch(NamedTuple):
    """A devlink device's eSwitch; None where the driver did not say (no such mode)."""

    bus: str
    dev: str
    mode: str | None = None
    inline_mode: str | None = None
    encap_mode: str | None = None


@dataclass(frozen=True, slots=True)
class Port:
    bus: str
    dev: str
    index: int
    flavour: str | None = None
    pf_number: int | None = None
    vf_number: int | None = None  # pcivf ports: the VF this port represents
    netdev: str | None = None  # the representor's netdev
    hw_addr: str | None = None  # the port function's hardware address (a VF's MAC)
    fn_state: str | None = None
    fn_opstate: str | None = None


# The errnos with which a driver says it has no eSwitch (or not this option of it).
NO_ESWITCH = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP})


def handle(pf: str) -> tuple[str, str]:
    """A PF's devlink handle (bus, device), from its PCI address or netdevsim device name
    (the lab's netdevsim devices are ``netdevsim/netdevsimN``)."""
    return ("netdevsim", pf) if pf.startswith("netdevsim") else ("pci", pf)


def genl(
    family_id: int, cmd: int, flags: int, seq: int, attrs: bytes, version: int = VERSION
) -> bytes:
    return pack_message(family_id, flags, seq, GENL_HEADER.pack(cmd, version, 0) + attrs)


def genl_cmd(msg: NlMsg) -> int:
    """The devlink command of a reply or an event (cmd of its genlmsghdr)."""
    return int(GENL_HEADER.unpack_from(msg.data, 0)[0])


def _attrs(msg: NlMsg) -> list[tuple[int, bytes]]:
    return iter_attrs(msg.data, GENL_HEADER.size)


def _u16(value: int) -> bytes:
    return struct.pack("=H", value)


def _named(names: tuple[str, ...] | dict[int, str], value: int) -> str:
    try:
        return names[value]
    except (IndexError, KeyError):
        return f"unknown({value})"


def _device(bus: str, dev: str) -> bytes:
    return attr(ATTR_BUS_NAME, asciiz(bus)) + attr(ATTR_DEV_NAME, asciiz(dev))


def mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def mac_bytes(text: str) -> bytes:
    return bytes(int(part, 16) for part in text.split(":"))


# --- the controller ---------------------------------------------------------------------


def family_request(seq: int, name: str = FAMILY) -> bytes:
    return genl(
        GENL_ID_CTRL,
        CTRL_CMD_GETFAMILY,
        NLM_F_REQUEST,
        seq,
        attr(CTRL_ATTR_FAMILY_NAME, asciiz(name)),
        version=1,
    )


def parse_family(msg: NlMsg) -> Family:
    family_id = 0
    groups: dict[str, int] = {}
    for atype, value in _attrs(msg):
        if atype == CTRL_ATTR_FAMILY_ID:
            family_id = get_uint(value)
        elif atype == CTRL_ATTR_MCAST_GROUPS:
            for _, group in iter_attrs(value):
                fields = dict(iter_attrs(group))
                if CTRL_ATTR_MCAST_GRP_NAME in fields and CTRL_ATTR_MCAST_GRP_ID in fields:
                    name = cstr(fields[CTRL_ATTR_MCAST_GRP_NAME])
                    groups[name] = get_uint(fields[CTRL_ATTR_MCAST_GRP_ID])
    return Family(family_id, groups)


# --- devices -----------------------------------------------------------------------------


def device_dump_request(family_id: int, seq: int) -> bytes:
    """Every devlink instance (``devlink dev``)."""
    return genl(family_id, CMD_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, b"")


def parse_device(msg: NlMsg) -> tuple[str, str]:
    """(bus, dev) of a devlink instance: ("pci", "0000:3b:00.0"), ("netdevsim", "netdevsim1")."""
    fields = dict(_attrs(msg))
    return cstr(fields.get(ATTR_BUS_NAME, b"")), cstr(fields.get(ATTR_DEV_NAME, b""))


# --- eswitch ------------------------------------------------------------------------------


def eswitch_get_request(family_id: int, seq: int, bus: str, dev: str) -> bytes:
    return genl(family_id, CMD_ESWITCH_GET, NLM_F_REQUEST, seq, _device(bus, dev))


def eswitch_set_request(
    family_id: int,
    seq: int,
    bus: str,
    dev: str,
    mode: str | None = None,
    inline_mode: str | None = None,
    encap_mode: str | None = None,
) -> bytes:
    """Only what is given is sent (the kernel leaves the rest as it is); a name not in
    the kernel's list raises ValueError."""
    parts = [_device(bus, dev)]
    if mode is not None:
        parts.append(attr(ATTR_ESWITCH_MODE, _u16(ESWITCH_MODES.index(mode))))
    if inline_mode is not None:
        parts.append(attr(ATTR_ESWITCH_INLINE_MODE, bytes([INLINE_MODES.index(inline_mode)])))
    if encap_mode is not None:
        parts.append(attr(ATTR_ESWITCH_ENCAP_MODE, bytes([ENCAP_MODES.index(encap_mode)])))
    return genl(family_id, CMD_ESWITCH_SET, NLM_F_REQUEST | NLM_F_ACK, seq, b"".join(parts))


def parse_eswitch(msg: NlMsg) -> Eswitch:
    bus = dev = ""
    mode = inline = encap = None
    for atype, value in _attrs(msg):
        if atype == ATTR_BUS_NAME:
            bus = cstr(value)
        elif atype == ATTR_DEV_NAME:
            dev = cstr(value)
        elif atype == ATTR_ESWITCH_MODE:
            mode = _named(ESWITCH_MODES, get_uint(value))
        elif atype == ATTR_ESWITCH_INLINE_MODE:
            inline = _named(INLINE_MODES, get_uint(value))
        elif atype == ATTR_ESWITCH_ENCAP_MODE:
            encap = _named(ENCAP_MODES, get_uint(value))
    return Eswitch(bus, dev, mode, inline, encap)


# --- ports --------------------------------------------------------------------------------


def port_dump_request(
    family_id: int, seq: int, bus: str | None = None, dev: str | None = None
) -> bytes:
    """Every port (of one device when given: kernels since 5.x filter the dump)."""
    attrs = _device(bus, dev) if bus is not None and dev is not None else b""
    return genl(family_id, CMD_PORT_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, attrs)


def port_function_set_request(
    family_id: int, seq: int, bus: str, dev: str, index: int, hw_addr: str
) -> bytes:
    """``devlink port function set pci/BDF/INDEX hw_addr MAC``."""
    function = nested(ATTR_PORT_FUNCTION, [attr(PORT_FUNCTION_ATTR_HW_ADDR, mac_bytes(hw_addr))])
    body = _device(bus, dev) + attr(ATTR_PORT_INDEX, u32(index)) + function
    return genl(family_id, CMD_PORT_SET, NLM_F_REQUEST | NLM_F_ACK, seq, body)


def parse_port(msg: NlMsg) -> Port:
    bus = dev = ""
    index = 0
    flavour = netdev = hw_addr = fn_state = fn_opstate = None
    pf_number = vf_number = None
    for atype, value in _attrs(msg):
        if atype == ATTR_BUS_NAME:
            bus = cstr(value)
        elif atype == ATTR_DEV_NAME:
            dev = cstr(value)
        elif atype == ATTR_PORT_INDEX:
            index = get_uint(value)
        elif atype == ATTR_PORT_FLAVOUR:
            flavour = _named(FLAVOURS, get_uint(value))
        elif atype == ATTR_PORT_PCI_PF_NUMBER:
            pf_number = get_uint(value)
        elif atype == ATTR_PORT_PCI_VF_NUMBER:
            vf_number = get_uint(value)
        elif atype == ATTR_PORT_NETDEV_NAME:
            netdev = cstr(value)
        elif atype == ATTR_PORT_FUNCTION:
            for ftype, fvalue in iter_attrs(value):
                if ftype == PORT_FUNCTION_ATTR_HW_ADDR:
                    hw_addr = mac_text(fvalue)
                elif ftype == PORT_FN_ATTR_STATE:
                    fn_state = _named(FN_STATES, get_uint(fvalue))
                elif ftype == PORT_FN_ATTR_OPSTATE:
                    fn_opstate = _named(FN_OPSTATES, get_uint(fvalue))
    return Port(
        bus, dev, index, flavour, pf_number, vf_number, netdev, hw_addr, fn_state, fn_opstate
    )
