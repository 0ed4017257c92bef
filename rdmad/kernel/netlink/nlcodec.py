"""Netlink framing shared by rtnetlink and RDMA netlink: headers, attributes, error acks.

Pure bytes in, values out (no sockets). Hand-written with ``struct`` because the
format is a handful of fixed layouts from ``linux/netlink.h`` and every library that
offers it (pyroute2) comes with a package import that costs more than rdmad's whole
kernel layer; the tests check these helpers against pyroute2's decoder.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple

# linux/netlink.h
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
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF  # strips NLA_F_NESTED / NLA_F_NET_BYTEORDER

HEADER = struct.Struct("=IHHII")  # struct nlmsghdr: len, type, flags, seq, pid
_NLA = struct.Struct("=HH")  # struct nlattr: len, type


class NlMsg(NamedTuple):
    """One received netlink message; ``data`` is the payload after the 16-byte header."""

    type: int
    flags: int
    seq: int
    data: bytes


def pack_message(mtype: int, flags: int, seq: int, payload: bytes) -> bytes:
    return HEADER.pack(HEADER.size + len(payload), mtype, flags, seq, 0) + payload


def split_messages(data: bytes) -> list[NlMsg]:
    """The messages of one datagram; a truncated tail is dropped."""
    out = []
    off = 0
    while off + HEADER.size <= len(data):
        length, mtype, flags, seq, _pid = HEADER.unpack_from(data, off)
        if length < HEADER.size or off + length > len(data):
            break
        out.append(NlMsg(mtype, flags, seq, data[off + HEADER.size : off + length]))
        off += align(length)
    return out


def align(n: int) -> int:
    return (n + 3) & ~3


# --- attributes ---------------------------------------------------------------------------


def attr(atype: int, payload: bytes) -> bytes:
    """One attribute, padded to 4 bytes (the padding is not counted in its length)."""
    length = _NLA.size + len(payload)
    return _NLA.pack(length, atype) + payload + b"\0" * (align(length) - length)


def nested(atype: int, parts: Iterable[bytes]) -> bytes:
    """A nested attribute, sent without NLA_F_NESTED as iproute2 does (rtnetlink parses
    its VF lists liberally; the flag buys nothing and older kernels never saw it)."""
    return attr(atype, b"".join(parts))


def u8(value: int) -> bytes:
    return struct.pack("=B", value)


def u32(value: int) -> bytes:
    return struct.pack("=I", value)


def asciiz(text: str) -> bytes:
    return text.encode() + b"\0"


def iter_attrs(data: bytes, off: int = 0, end: int | None = None) -> list[tuple[int, bytes]]:
    """Attributes in ``data[off:end]`` as (type without flags, payload), in order."""
    end = len(data) if end is None else end
    out = []
    while off + _NLA.size <= end:
        alen, atype = _NLA.unpack_from(data, off)
        if alen < _NLA.size or off + alen > end:
            break
        out.append((atype & NLA_TYPE_MASK, data[off + _NLA.size : off + alen]))
        off += align(alen)
    return out


def find_attr(data: bytes, atype: int, off: int = 0) -> bytes | None:
    """The payload of the first attribute of type ``atype`` in ``data[off:]``; the walk
    stops there (an event reader wanting one attribute skips parsing the other dozens)."""
    end = len(data)
    while off + _NLA.size <= end:
        alen, kind = _NLA.unpack_from(data, off)
        if alen < _NLA.size or off + alen > end:
            return None
        if kind & NLA_TYPE_MASK == atype:
            return data[off + _NLA.size : off + alen]
        off += align(alen)
    return None


def cstr(value: bytes) -> str:
    return value.split(b"\0", 1)[0].decode("utf-8", "replace")


def get_u32(value: bytes, off: int = 0) -> int:
    return int(struct.unpack_from("=I", value, off)[0])


def get_u64(value: bytes) -> int:
    return int(struct.unpack_from("=Q", value)[0])


def get_uint(value: bytes) -> int:
    """An unsigned attribute of the size it came in (u8/u16/u32/u64)."""
    return int.from_bytes(value[:8], "little")


# --- acks ---------------------------------------------------------------------------------


def parse_error(msg: NlMsg) -> tuple[int, str]:
    """(errno, extack text) of an NLMSG_ERROR; errno 0 is an ack."""
    (code,) = struct.unpack_from("=i", msg.data, 0)
    text = ""
    if msg.flags & NLM_F_ACK_TLVS:
        # The request follows the error code: only its header when the ack is capped.
        (req_len,) = struct.unpack_from("=I", msg.data, 4)
        off = 4 + (HEADER.size if msg.flags & NLM_F_CAPPED else align(req_len))
        for atype, value in iter_attrs(msg.data, off):
            if atype == NLMSGERR_ATTR_MSG:
                text = cstr(value)
    return -code, text
