"""rtnetlink: list links with their VF settings, set VF settings, watch link events.

Why this module talks to the netlink socket itself instead of through ``AsyncIPRoute``
(pyroute2 0.9.7), while still building its requests with pyroute2's message classes:

* Speed of the read path. ``links()`` runs on every reconcile pass. pyroute2 builds an
  object per attribute of every link (stats, AF_SPEC, ...): 300 links took 92 ms to
  parse on the development host, where reading only the attributes rdmad needs takes
  5 ms (18x; TCG guests are ~10-20x slower still). So replies are read by the small
  decoder below (``parse_link``), which the tests cross-check against pyroute2.
* Overflow. When an ``AsyncIPRoute`` socket gets ENOBUFS, its asyncio transport marks
  the whole object dead (every later call raises). The event stream must instead say
  "resync needed" and keep going, so it owns its socket.
* 802.1ad. pyroute2 encodes ``IFLA_VF_VLAN_INFO`` as 14 bytes; kernels carrying the
  2024 fix "rtnetlink: fix error logic of IFLA_BRIDGE_FLAGS/IFLA_VF_VLAN_LIST" (6.1.x
  stable and later, the dev host's 6.18) require ``sizeof(struct ifla_vf_vlan_info)``
  = 16 and answer EINVAL. ``_SetLinkMsg`` overrides just that class.
* ``AsyncNetlinkSocket.nlm_request`` accepts a ``parser`` argument and drops it, so
  there is no supported hook to bypass its decoder.

Everything is asyncio-native: a non-blocking socket read with ``loop.add_reader``
(no thread, no polling). Requests on one ``RtNetlink`` are serialised by a lock;
replies are matched by sequence number, so a cancelled request cannot confuse the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import socket
import struct
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from rdmad.kernel.errors import KernelError
from rdmad.kernel.pyroute2_lean import ifinfmsg, nla
from rdmad.model import VfChange, VfSettings

# --- netlink and rtnetlink constants (linux/netlink.h, linux/rtnetlink.h, linux/if_link.h)

NETLINK_ROUTE = 0
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11
SO_RCVBUFFORCE = 33

NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP_INTR = 0x10
NLM_F_DUMP = 0x300
NLM_F_CAPPED = 0x100
NLM_F_ACK_TLVS = 0x200
NLMSGERR_ATTR_MSG = 1

RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_GETLINK = 18
RTM_SETLINK = 19
RTMGRP_LINK = 1

IFLA_ADDRESS = 1
IFLA_IFNAME = 3
IFLA_OPERSTATE = 16
IFLA_LINKINFO = 18
IFLA_NUM_VF = 21
IFLA_VFINFO_LIST = 22
IFLA_EXT_MASK = 29
IFLA_PERM_ADDRESS = 54
IFLA_PARENT_DEV_NAME = 56
IFLA_PARENT_DEV_BUS_NAME = 57
IFLA_INFO_KIND = 1

IFLA_VF_INFO = 1
IFLA_VF_MAC = 1
IFLA_VF_VLAN = 2
IFLA_VF_SPOOFCHK = 4
IFLA_VF_LINK_STATE = 5
IFLA_VF_RATE = 6
IFLA_VF_RSS_QUERY_EN = 7
IFLA_VF_TRUST = 9
IFLA_VF_VLAN_LIST = 12
IFLA_VF_VLAN_INFO = 1

RTEXT_FILTER_VF = 1 << 0
RTEXT_FILTER_SKIP_STATS = 1 << 3

IFF_UP = 0x1
NLA_TYPE_MASK = 0x3FFF  # strips NLA_F_NESTED / NLA_F_NET_BYTEORDER

ETH_P_8021Q = 0x8100
ETH_P_8021AD = 0x88A8
VLAN_PROTOS = {ETH_P_8021Q: "802.1Q", ETH_P_8021AD: "802.1ad"}
LINK_STATES = ("auto", "enable", "disable")  # IFLA_VF_LINK_STATE_AUTO/ENABLE/DISABLE
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")
_UNSET = 0xFFFFFFFF  # the kernel pre-fills spoofchk/trust/rss_query with -1 ("not reported")

_HDR = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_IFI = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_NLA = struct.Struct("=HH")
_RECV_BUF = 1 << 20
EVENTS_RCVBUF = 8 << 20

# --- results ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """One netdev as RTM_GETLINK reports it; the fields ``observe.LinkFacts`` reads, and more."""

    name: str
    ifindex: int
    mac: str | None
    perm_mac: str | None
    up: bool  # IFF_UP: administratively up
    operstate: str  # "up", "down", "lowerlayerdown", "unknown", ...
    kind: str | None  # IFLA_INFO_KIND: "veth", "bridge", ...; None for plain hardware
    num_vf: int | None = None  # None: not an SR-IOV PF (no IFLA_NUM_VF)
    vfs: Mapping[int, VfSettings] = field(default_factory=dict)
    vfs_complete: bool = True  # False: the kernel listed fewer VFs than num_vf
    parent_dev: str | None = None  # IFLA_PARENT_DEV_NAME, e.g. a PCI address (kernel >= 5.16)
    parent_bus: str | None = None  # IFLA_PARENT_DEV_BUS_NAME, e.g. "pci"

    @property
    def pci(self) -> str | None:
        return self.parent_dev if self.parent_bus == "pci" else None


@dataclass(frozen=True, slots=True)
class VfChangeResult:
    """What became of one requested ``VfChange``: applied (``error`` None) or why not."""

    change: VfChange
    error: KernelError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class LinkEvent:
    """A link notification. ``kind`` "resync" means events were lost: observe everything again.

    "add" is an RTM_NEWLINK with a full change mask (a new link, or one moved into this
    namespace); "change" is any other RTM_NEWLINK (flags, rename: compare ``name`` with
    ``old_name``); "del" is RTM_DELLINK (deleted, or moved to another namespace).
    Track links by ``ifindex``: names change.
    """

    kind: Literal["add", "del", "change", "resync"]
    ifindex: int = 0
    name: str | None = None
    old_name: str | None = None  # the previous name, when this stream saw it change
    up: bool | None = None


# --- a small asyncio netlink transport --------------------------------------------------


@dataclass(frozen=True, slots=True)
class NlMsg:
    """One received netlink message; ``data`` is the payload after the 16-byte header."""

    type: int
    flags: int
    seq: int
    data: bytes


class NetlinkFailure(Exception):
    """A netlink request answered with an error (errno > 0) and the kernel's extack text."""

    def __init__(self, errno_: int, message: str = "") -> None:
        super().__init__(errno_, message)
        self.errno = errno_
        self.message = message


def _setns_socket(netns: str, family: int, stype: int, proto: int) -> socket.socket:
    """Create a socket inside a named netns (``/run/netns/NAME`` or a path).

    setns(CLONE_NEWNET) changes only the calling thread, and a socket keeps the netns it
    was created in, so a short-lived thread does it: no fork, nothing else affected.
    """
    path = netns if "/" in netns else f"/run/netns/{netns}"
    box: list[socket.socket | BaseException] = []

    def work() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {path}: {os.strerror(err)}")
            finally:
                os.close(fd)
            box.append(socket.socket(family, stype, proto))
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=work, name="rdmad-setns")
    thread.start()
    thread.join()
    result = box[0]
    if isinstance(result, BaseException):
        raise result
    return result


def open_netlink_socket(
    protocol: int, *, netns: str | None = None, groups: int = 0, rcvbuf: int = 1 << 20
) -> socket.socket:
    """A bound, non-blocking netlink socket with extended acks and a large receive buffer."""
    if netns is None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)
    else:
        sock = _setns_socket(netns, socket.AF_NETLINK, socket.SOCK_RAW, protocol)
    try:
        set_rcvbuf(sock, rcvbuf)
        for opt in (NETLINK_EXT_ACK, NETLINK_CAP_ACK):
            with contextlib.suppress(OSError):  # old kernel: errors come without text
                sock.setsockopt(SOL_NETLINK, opt, 1)
        sock.bind((0, groups))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def set_rcvbuf(sock: socket.socket, size: int) -> None:
    """SO_RCVBUFFORCE (root may exceed net.core.rmem_max), else SO_RCVBUF."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, size)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


async def _readable(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await fut
    finally:
        loop.remove_reader(fd)


def recv_nowait(sock: socket.socket, buf: bytearray) -> bytes | None:
    """One datagram, or None when nothing is queued. ENOBUFS and others raise OSError."""
    try:
        n, _, flags, _ = sock.recvmsg_into([buf])
    except BlockingIOError:
        return None
    if flags & socket.MSG_TRUNC:
        raise OSError(errno.EMSGSIZE, "netlink datagram larger than the receive buffer")
    return bytes(buf[:n])


def split_messages(data: bytes) -> list[NlMsg]:
    out = []
    off = 0
    while off + 16 <= len(data):
        length, mtype, flags, seq, _pid = _HDR.unpack_from(data, off)
        if length < 16 or off + length > len(data):
            break
        out.append(NlMsg(mtype, flags, seq, data[off + 16 : off + length]))
        off += (length + 3) & ~3
    return out


def parse_error(msg: NlMsg) -> tuple[int, str]:
    """(errno, extack text) of an NLMSG_ERROR; errno 0 is an ack."""
    (code,) = struct.unpack_from("=i", msg.data, 0)
    text = ""
    if msg.flags & NLM_F_ACK_TLVS:
        # The request follows the error code: only its header when the ack is capped.
        (req_len,) = struct.unpack_from("=I", msg.data, 4)
        off = 4 + (16 if msg.flags & NLM_F_CAPPED else (req_len + 3) & ~3)
        for atype, value in iter_attrs(msg.data, off, len(msg.data)):
            if atype == NLMSGERR_ATTR_MSG:
                text = _cstr(value)
    return -code, text


class NetlinkTransport:
    """Request/response over one netlink socket, usable from any running event loop."""

    def __init__(self, protocol: int, netns: str | None = None) -> None:
        self._protocol = protocol
        self._netns = netns
        self._sock: socket.socket | None = None
        self._buf = bytearray(_RECV_BUF)
        self._seq = int.from_bytes(os.urandom(2), "little") << 8
        self._lock = asyncio.Lock()

    def get_socket(self) -> socket.socket:
        if self._sock is None:
            self._sock = open_netlink_socket(self._protocol, netns=self._netns)
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF or 1
        return self._seq

    async def request(self, mtype: int, flags: int, payload: bytes) -> list[NlMsg]:
        """Send one message; return the replies (a dump's parts) or raise NetlinkFailure.

        Non-dump requests carry NLM_F_ACK, so one that returns nothing still ends with an
        ack; dumps end with NLMSG_DONE (and RDMA netlink would ack a dump with EINTR).
        """
        async with self._lock:
            sock = self.get_socket()
            seq = self.next_seq()
            flags |= NLM_F_REQUEST if flags & NLM_F_DUMP else NLM_F_REQUEST | NLM_F_ACK
            sock.send(_HDR.pack(16 + len(payload), mtype, flags, seq, 0) + payload)
            return await self._collect(sock, seq)

    async def _collect(self, sock: socket.socket, seq: int) -> list[NlMsg]:
        replies: list[NlMsg] = []
        while True:
            data = recv_nowait(sock, self._buf)
            if data is None:
                await _readable(sock)
                continue
            for msg in split_messages(data):
                if msg.seq != seq:
                    continue  # late reply to a cancelled request
                if msg.type == NLMSG_ERROR:
                    code, text = parse_error(msg)
                    if code:
                        raise NetlinkFailure(code, text)
                    return replies
                if msg.type == NLMSG_DONE:
                    code = -struct.unpack_from("=i", msg.data, 0)[0] if msg.data else 0
                    if code:
                        raise NetlinkFailure(code, "dump failed")
                    if msg.flags & NLM_F_DUMP_INTR:
                        raise NetlinkFailure(errno.EINTR, "dump interrupted by a change")
                    return replies
                replies.append(msg)
                if not msg.flags & NLM_F_MULTI:
                    return replies


# --- attribute helpers --------------------------------------------------------------------


def iter_attrs(data: bytes, off: int, end: int) -> list[tuple[int, bytes]]:
    """Top-level netlink attributes in ``data[off:end]`` as (type, payload)."""
    out = []
    while off + 4 <= end:
        alen, atype = _NLA.unpack_from(data, off)
        if alen < 4 or off + alen > end:
            break
        out.append((atype & NLA_TYPE_MASK, data[off + 4 : off + alen]))
        off += (alen + 3) & ~3
    return out


def _cstr(value: bytes) -> str:
    return value.split(b"\0", 1)[0].decode("utf-8", "replace")


def _mac(value: bytes) -> str | None:
    return ":".join(f"{b:02x}" for b in value) if value else None


def _u32(value: bytes) -> int:
    return int(struct.unpack_from("=I", value)[0])


# --- decoding RTM_NEWLINK -------------------------------------------------------------------


def parse_link(data: bytes) -> LinkInfo:
    """Decode an RTM_NEWLINK payload (ifinfomsg + attributes) into a ``LinkInfo``."""
    _family, _type, index, flags, _change = _IFI.unpack_from(data, 0)
    attrs = dict(iter_attrs(data, _IFI.size, len(data)))
    num_vf = _u32(attrs[IFLA_NUM_VF]) if IFLA_NUM_VF in attrs else None
    vfs: dict[int, VfSettings] = {}
    if IFLA_VFINFO_LIST in attrs:
        vfs = parse_vfinfo_list(attrs[IFLA_VFINFO_LIST])
    kind = None
    if IFLA_LINKINFO in attrs:
        info = dict(iter_attrs(attrs[IFLA_LINKINFO], 0, len(attrs[IFLA_LINKINFO])))
        kind = _cstr(info[IFLA_INFO_KIND]) if IFLA_INFO_KIND in info else None
    oper = attrs.get(IFLA_OPERSTATE, b"\0")[0]
    return LinkInfo(
        name=_cstr(attrs.get(IFLA_IFNAME, b"")),
        ifindex=index,
        mac=_mac(attrs.get(IFLA_ADDRESS, b"")),
        perm_mac=_mac(attrs.get(IFLA_PERM_ADDRESS, b"")),
        up=bool(flags & IFF_UP),
        operstate=OPERSTATES[oper] if oper < len(OPERSTATES) else str(oper),
        kind=kind,
        num_vf=num_vf,
        vfs=vfs,
        vfs_complete=num_vf is None or len(vfs) >= num_vf,
        parent_dev=_cstr(attrs[IFLA_PARENT_DEV_NAME]) if IFLA_PARENT_DEV_NAME in attrs else None,
        parent_bus=(
            _cstr(attrs[IFLA_PARENT_DEV_BUS_NAME]) if IFLA_PARENT_DEV_BUS_NAME in attrs else None
        ),
    )


def parse_vfinfo_list(data: bytes) -> dict[int, VfSettings]:
    vfs: dict[int, VfSettings] = {}
    for atype, entry in iter_attrs(data, 0, len(data)):
        if atype == IFLA_VF_INFO:
            vf, settings = parse_vf_info(entry)
            if vf is not None:
                vfs[vf] = settings
    return vfs


def _flag(value: bytes) -> bool | None:
    setting = struct.unpack_from("=I", value, 4)[0]
    return None if setting == _UNSET else bool(setting)


def parse_vf_info(data: bytes) -> tuple[int | None, VfSettings]:
    """One IFLA_VF_INFO. Every VF attribute struct starts with ``__u32 vf``."""
    vf: int | None = None
    s: dict[str, Any] = {}
    for atype, v in iter_attrs(data, 0, len(data)):
        if len(v) >= 4:
            vf = _u32(v)
        if atype == IFLA_VF_MAC and len(v) >= 10:
            s["mac"] = _mac(v[4:10])
        elif atype == IFLA_VF_VLAN and len(v) >= 12:
            _, s["vlan"], s["qos"] = struct.unpack_from("=III", v)
            s.setdefault("vlan_proto", "802.1Q")
        elif atype == IFLA_VF_VLAN_LIST:
            for itype, info in iter_attrs(v, 0, len(v)):
                if itype == IFLA_VF_VLAN_INFO and len(info) >= 14:
                    vf, s["vlan"], s["qos"] = struct.unpack_from("=III", info)
                    (proto,) = struct.unpack_from("!H", info, 12)
                    s["vlan_proto"] = VLAN_PROTOS.get(proto, f"0x{proto:04x}")
                    break
        elif atype == IFLA_VF_RATE and len(v) >= 12:
            _, s["min_tx_rate"], s["max_tx_rate"] = struct.unpack_from("=III", v)
        elif atype == IFLA_VF_SPOOFCHK and len(v) >= 8:
            s["spoofchk"] = _flag(v)
        elif atype == IFLA_VF_TRUST and len(v) >= 8:
            s["trust"] = _flag(v)
        elif atype == IFLA_VF_RSS_QUERY_EN and len(v) >= 8:
            s["query_rss"] = _flag(v)
        elif atype == IFLA_VF_LINK_STATE and len(v) >= 8:
            state = struct.unpack_from("=I", v, 4)[0]
            s["link_state"] = LINK_STATES[state] if state < len(LINK_STATES) else str(state)
    return vf, VfSettings(**s)


# --- encoding RTM_SETLINK with VF attributes ----------------------------------------------


_T = TypeVar("_T", bound=type)


def own_nla_table(cls: _T) -> _T:
    """Make a pyroute2 message/nla subclass compile its own attribute table.

    pyroute2 caches the compiled table on the class and a subclass inherits the
    "already compiled" flag: a subclass first used after its parent would silently
    encode with the parent's nested classes (found the hard way: the 802.1ad fix below
    worked only until plain ``ifinfmsg`` had been used once).
    """
    cls._nlmsg_base__compiled_nla = False  # type: ignore[attr-defined]
    return cls


@own_nla_table
class _SetLinkMsg(ifinfmsg):  # type: ignore[misc]
    """pyroute2's ifinfmsg with a correctly sized IFLA_VF_VLAN_INFO (see module docstring)."""

    @own_nla_table
    class vflist(ifinfmsg.vflist):  # type: ignore[misc]
        @own_nla_table
        class vfinfo(ifinfmsg.vflist.vfinfo):  # type: ignore[misc]
            @own_nla_table
            class vf_vlist(ifinfmsg.vflist.vfinfo.vf_vlist):  # type: ignore[misc]
                @own_nla_table
                class ivvi(nla):  # type: ignore[misc]
                    # struct ifla_vf_vlan_info: __u32 vf, vlan, qos; __be16 vlan_proto; + 2 pad
                    fields = (
                        ("vf", "I"),
                        ("vlan", "I"),
                        ("qos", "I"),
                        ("proto", ">H"),
                        ("__pad", "2x"),
                    )


# A "piece" is what travels as one IFLA_VF_* attribute, listed in the order the kernel's
# do_setvfinfo() applies them. vlan/qos/proto share one attribute, and so do the rates.
PIECES: tuple[tuple[str, ...], ...] = (
    ("mac",),
    ("vlan", "qos", "vlan_proto"),
    ("min_tx_rate", "max_tx_rate"),
    ("spoofchk",),
    ("link_state",),
    ("query_rss",),
    ("trust",),
)
_PIECE_OF = {attr: piece for piece in PIECES for attr in piece}


@dataclass(frozen=True, slots=True)
class _Piece:
    vf: int
    attrs: tuple[str, ...]  # the VfSettings fields this piece carries
    changes: tuple[VfChange, ...]  # the requested changes it applies
    nla: tuple[str, dict[str, Any]]  # (pyroute2 nla name, value)
    text: str  # what was sent, for messages: "vlan 100 qos 0 proto 802.1ad"


def _validate(change: VfChange) -> str | None:
    """Why a change cannot be encoded at all, or None."""
    attr, new = change.attr, change.new
    if attr not in _PIECE_OF:
        return f"unknown VF attribute {attr!r}"
    ok = {
        "mac": isinstance(new, str) and len(new.split(":")) == 6,
        "vlan": isinstance(new, int) and 0 <= new <= 4095,
        "qos": isinstance(new, int) and 0 <= new <= 7,
        "vlan_proto": new in ("802.1Q", "802.1ad"),
        "min_tx_rate": isinstance(new, int) and new >= 0,
        "max_tx_rate": isinstance(new, int) and new >= 0,
        "link_state": new in LINK_STATES,
    }.get(attr, isinstance(new, bool))
    return None if ok else f"cannot set {attr} to {new!r}"


def _piece(vf: int, attrs: tuple[str, ...], changes: list[VfChange], cur: VfSettings) -> _Piece:
    """Encode one piece; values not being changed are filled from ``cur`` (or defaults)."""
    new = {c.attr: c.new for c in changes}

    def val(name: str, default: Any) -> Any:
        if name in new:
            return new[name]
        have = getattr(cur, name)
        return default if have is None else have

    if attrs[0] == "mac":
        mac = str(new["mac"]).lower()
        return _Piece(vf, attrs, tuple(changes), ("IFLA_VF_MAC", {"vf": vf, "mac": mac}), mac)
    if attrs[0] == "vlan":
        vlan, qos, proto = val("vlan", 0), val("qos", 0), val("vlan_proto", "802.1Q")
        text = f"vlan {vlan} qos {qos} proto {proto}"
        if proto == "802.1Q":  # the old attribute: understood by every driver
            value: dict[str, Any] = {"vf": vf, "vlan": vlan, "qos": qos}
            return _Piece(vf, attrs, tuple(changes), ("IFLA_VF_VLAN", value), text)
        info = {"vf": vf, "vlan": vlan, "qos": qos, "proto": ETH_P_8021AD}
        vlist = {"attrs": [("IFLA_VF_VLAN_INFO", info)]}
        return _Piece(vf, attrs, tuple(changes), ("IFLA_VF_VLAN_LIST", vlist), text)
    if attrs[0] == "min_tx_rate":
        lo, hi = val("min_tx_rate", 0), val("max_tx_rate", 0)
        value = {"vf": vf, "min_tx_rate": lo, "max_tx_rate": hi}
        return _Piece(vf, attrs, tuple(changes), ("IFLA_VF_RATE", value), f"rate {lo}-{hi}")
    name = attrs[0]
    if name == "link_state":
        state = str(new[name])
        value = {"vf": vf, "link_state": LINK_STATES.index(state)}
        return _Piece(vf, attrs, tuple(changes), ("IFLA_VF_LINK_STATE", value), state)
    nla_name, field_name = {
        "spoofchk": ("IFLA_VF_SPOOFCHK", "spoofchk"),
        "trust": ("IFLA_VF_TRUST", "trust"),
        "query_rss": ("IFLA_VF_RSS_QUERY_EN", "rss_query_en"),
    }[name]
    on = bool(new[name])
    value = {"vf": vf, field_name: int(on)}
    return _Piece(vf, attrs, tuple(changes), (nla_name, value), "on" if on else "off")


def plan_pieces(
    changes: Sequence[VfChange], current: Mapping[int, VfSettings]
) -> tuple[list[_Piece], list[VfChangeResult]]:
    """Group changes into encodable pieces (VF order, kernel order); reject the invalid."""
    rejected: list[VfChangeResult] = []
    grouped: dict[int, dict[tuple[str, ...], list[VfChange]]] = {}
    for change in changes:
        why = _validate(change)
        if why is not None:
            err = KernelError(f"set vf {change.vf} {change.attr}", "", None, why)
            rejected.append(VfChangeResult(change, err))
            continue
        grouped.setdefault(change.vf, {}).setdefault(_PIECE_OF[change.attr], []).append(change)
    pieces = []
    for vf in sorted(grouped):
        cur = current.get(vf) or VfSettings()
        for attrs in PIECES:
            if attrs in grouped[vf]:
                pieces.append(_piece(vf, attrs, grouped[vf][attrs], cur))
    return pieces, rejected


# IFLA_VFINFO_LIST's length is a u16: a batch must stay below 64 KiB. 40 bytes bounds one
# piece (IFLA_VF_MAC, the largest, is 4 + 36), 4 more per IFLA_VF_INFO: ~240 VFs with
# every attribute fit one message; larger sets go out as a few.
MAX_VFINFO_BYTES = 60_000


def split_batches(pieces: Sequence[_Piece]) -> list[list[_Piece]]:
    """Cut pieces (sorted by VF) into batches whose IFLA_VFINFO_LIST fits its u16 length."""
    batches: list[list[_Piece]] = []
    size = MAX_VFINFO_BYTES + 1
    last_vf: int | None = None
    for p in pieces:
        cost = 40 + (4 if p.vf != last_vf else 0)
        if p.vf != last_vf and size + cost + 40 * 6 > MAX_VFINFO_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(p)
        size += cost
        last_vf = p.vf
    return batches


def encode_setlink(target: int | str, pieces: Sequence[_Piece]) -> bytes:
    """The ifinfomsg payload of one RTM_SETLINK carrying one IFLA_VF_INFO per VF."""
    by_vf: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for p in pieces:
        by_vf.setdefault(p.vf, []).append(p.nla)
    msg = _SetLinkMsg()
    msg["index"] = target if isinstance(target, int) else 0
    attrs: list[tuple[str, Any]] = []
    if isinstance(target, str):
        attrs.append(("IFLA_IFNAME", target))
    vflist = [
        ("IFLA_VF_INFO", {"attrs": [(n, dict(v)) for n, v in nlas]}) for nlas in by_vf.values()
    ]
    attrs.append(("IFLA_VFINFO_LIST", {"attrs": vflist}))
    msg["attrs"] = attrs
    msg.encode()
    return bytes(msg.data[16:])  # the transport writes the nlmsghdr


def encode_getlink_dump() -> bytes:
    msg = ifinfmsg()
    msg["attrs"] = [("IFLA_EXT_MASK", RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS)]
    msg.encode()
    return bytes(msg.data[16:])


def encode_set_up(target: int | str) -> bytes:
    msg = ifinfmsg()
    msg["index"] = target if isinstance(target, int) else 0
    msg["flags"] = IFF_UP
    msg["change"] = IFF_UP
    if isinstance(target, str):
        msg["attrs"] = [("IFLA_IFNAME", target)]
    msg.encode()
    return bytes(msg.data[16:])


# --- the public class ----------------------------------------------------------------------


class RtNetlink:
    """rtnetlink access for one network namespace (default: the daemon's own)."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        self._nl = NetlinkTransport(NETLINK_ROUTE, netns)

    def close(self) -> None:
        self._nl.close()

    async def __aenter__(self) -> RtNetlink:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def links(self) -> list[LinkInfo]:
        """Every link of the namespace, with VF settings, in one RTM_GETLINK dump.

        IFLA_EXT_MASK asks for VFs but not their statistics, so 256 VFs fit the kernel's
        message (FIELD.md: truncation). A dump interrupted by a concurrent change is retried.
        """
        payload = encode_getlink_dump()
        for attempt in range(3):
            try:
                replies = await self._nl.request(RTM_GETLINK, NLM_F_DUMP, payload)
            except NetlinkFailure as exc:
                if exc.errno == errno.EINTR and attempt < 2:
                    continue
                raise KernelError("list links", self._where(), exc.errno, exc.message) from None
            except OSError as exc:
                raise KernelError("list links", self._where(), exc.errno, str(exc)) from None
            return [parse_link(m.data) for m in replies if m.type == RTM_NEWLINK]
        raise AssertionError("unreachable")

    async def set_up(self, link: int | str) -> None:
        await self._call(f"set {_label(link)} up", RTM_SETLINK, encode_set_up(link))

    async def set_vf_settings(
        self,
        link: int | str,
        changes: Sequence[VfChange],
        current: Mapping[int, VfSettings],
    ) -> list[VfChangeResult]:
        """Apply VF changes as one batched RTM_SETLINK; on refusal, find out exactly what failed.

        The kernel applies the IFLA_VF_INFO entries in order and stops at the first error,
        keeping what it applied; it does not say which entry failed. So after a refused
        batch, each VF is sent alone, and a VF that is refused is sent one piece at a time
        (re-sending values the batch already applied is harmless). More VFs than one
        IFLA_VFINFO_LIST can hold (~240 with every attribute) go out as a few batches.
        Results come back in the order of ``changes``.
        """
        target = _label(link)
        pieces, rejected = plan_pieces(changes, current)
        outcome: dict[int, KernelError | None] = {
            id(r.change): _retarget(r.error, target) for r in rejected
        }
        for batch in split_batches(pieces):
            for piece, error in await self._apply(link, batch):
                for change in piece.changes:
                    outcome[id(change)] = _explain(error, change, piece, target)
        return [VfChangeResult(c, outcome.get(id(c))) for c in changes]

    async def _apply(
        self, link: int | str, pieces: list[_Piece]
    ) -> list[tuple[_Piece, NetlinkFailure | None]]:
        error = await self._try(link, pieces)
        if error is None:
            return [(p, None) for p in pieces]
        vfs = sorted({p.vf for p in pieces})
        if len(vfs) == 1 and len(pieces) == 1:
            return [(pieces[0], error)]
        out: list[tuple[_Piece, NetlinkFailure | None]] = []
        for vf in vfs:
            mine = [p for p in pieces if p.vf == vf]
            vf_error = error if len(vfs) == 1 else await self._try(link, mine)
            if vf_error is None:
                out.extend((p, None) for p in mine)
            elif len(mine) == 1:
                out.append((mine[0], vf_error))
            else:
                for p in mine:
                    out.append((p, await self._try(link, [p])))
        return out

    async def _try(self, link: int | str, pieces: list[_Piece]) -> NetlinkFailure | None:
        try:
            await self._nl.request(RTM_SETLINK, 0, encode_setlink(link, pieces))
        except NetlinkFailure as exc:
            return exc
        except OSError as exc:
            return NetlinkFailure(exc.errno or errno.EIO, str(exc))
        return None

    async def _call(self, op: str, mtype: int, payload: bytes) -> None:
        try:
            await self._nl.request(mtype, 0, payload)
        except NetlinkFailure as exc:
            raise KernelError(op, self._where(), exc.errno, exc.message) from None
        except OSError as exc:
            raise KernelError(op, self._where(), exc.errno, str(exc)) from None

    def _where(self) -> str:
        return f"netns {self.netns}" if self.netns else "this host"

    def events(self, rcvbuf: int = EVENTS_RCVBUF) -> LinkEventStream:
        """Subscribe to link events now (the socket is bound before this returns).

        Subscribe first, then observe, and nothing falls between the two.
        """
        return LinkEventStream(self.netns, rcvbuf)


_VF_HINTS: dict[tuple[str, int], str] = {
    ("vlan_proto", errno.EPROTONOSUPPORT): "the driver supports only 802.1Q VF VLANs",
    ("link_state", errno.EOPNOTSUPP): "the driver cannot force a VF's link state",
    ("query_rss", errno.EOPNOTSUPP): "the driver cannot expose RSS to the VF",
    ("min_tx_rate", errno.EINVAL): "the driver or link speed does not allow this rate",
    ("max_tx_rate", errno.EINVAL): "the driver or link speed does not allow this rate",
}


def _label(link: int | str) -> str:
    return link if isinstance(link, str) else f"ifindex {link}"


def _retarget(error: KernelError | None, target: str) -> KernelError | None:
    if error is None:
        return None
    return KernelError(error.op, target, error.errno, error.detail)


def _explain(
    failure: NetlinkFailure | None, change: VfChange, piece: _Piece, target: str
) -> KernelError | None:
    """The refusal of one piece, told from the point of view of one change in it."""
    if failure is None:
        return None
    detail = [failure.message] if failure.message else []
    if len(piece.attrs) > 1:
        detail.append(f"sent together as {piece.text}")
    hint = _VF_HINTS.get((change.attr, failure.errno))
    if hint:
        detail.append(hint)
    return KernelError(
        f"set vf {change.vf} {change.attr}", target, failure.errno, "; ".join(detail)
    )


# --- link events --------------------------------------------------------------------------


class LinkEventStream:
    """Async iterator of ``LinkEvent`` from an RTMGRP_LINK socket; ENOBUFS yields "resync"."""

    def __init__(self, netns: str | None = None, rcvbuf: int = EVENTS_RCVBUF) -> None:
        self._sock: socket.socket | None = open_netlink_socket(
            NETLINK_ROUTE, netns=netns, groups=RTMGRP_LINK, rcvbuf=rcvbuf
        )
        self._buf = bytearray(_RECV_BUF)
        self._pending: list[LinkEvent] = []
        self._names: dict[int, str] = {}
        self.overflows = 0

    @property
    def sock(self) -> socket.socket:
        if self._sock is None:
            raise ValueError("link event stream is closed")
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def __aenter__(self) -> LinkEventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> AsyncIterator[LinkEvent]:
        return self

    async def __anext__(self) -> LinkEvent:
        while not self._pending:
            if self._sock is None:
                raise StopAsyncIteration
            self._drain()
            if not self._pending:
                await _readable(self.sock)
        return self._pending.pop(0)

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
        if msg.type not in (RTM_NEWLINK, RTM_DELLINK) or len(msg.data) < _IFI.size:
            return None
        _f, _t, index, flags, change = _IFI.unpack_from(msg.data, 0)
        attrs = dict(iter_attrs(msg.data, _IFI.size, len(msg.data)))
        name = _cstr(attrs[IFLA_IFNAME]) if IFLA_IFNAME in attrs else None
        old = self._names.get(index)
        if msg.type == RTM_DELLINK:
            self._names.pop(index, None)
            return LinkEvent("del", index, name, None, bool(flags & IFF_UP))
        if name is not None:
            self._names[index] = name
        kind: Literal["add", "change"] = "add" if change == 0xFFFFFFFF else "change"
        renamed = old if old is not None and old != name else None
        return LinkEvent(kind, index, name, renamed, bool(flags & IFF_UP))
