"""VF attributes on the wire (IFLA_VF_*): the kernel's struct layouts, encoded and decoded.

This is where the VF VLAN and its protocol (802.1Q / 802.1ad) are encoded.

Modelled on systemd's ``netif-sriov.c``: one typed record per VF (``VfRecord``), one
attribute enum (``VfAttr``) with a name table used in every log line and error, and each
attribute packed with ``struct`` from the kernel's own layout in ``linux/if_link.h``.
Hand-written because pyroute2 (0.9.7 and earlier) encodes ``IFLA_VF_VLAN_INFO`` in 14
bytes; kernels with the 2024 fix "rtnetlink: fix error logic of IFLA_BRIDGE_FLAGS/
IFLA_VF_VLAN_LIST" check ``sizeof(struct ifla_vf_vlan_info)`` = 16 and answer EINVAL to
every 802.1ad request, and pyroute2 has no public hook to replace one nested attribute.

Rules for what is written (the VLAN one is the reason this module exists):

* a VLAN without a declared protocol is 802.1Q, as with ``ip link set DEV vf N vlan V``
  and systemd-networkd; 802.1Q travels in the old ``IFLA_VF_VLAN`` every driver knows,
  802.1ad only in ``IFLA_VF_VLAN_LIST``/``IFLA_VF_VLAN_INFO`` (the old one has no
  protocol field);
* a protocol read back that is neither (netdevsim's fresh VFs report 0) is reported
  by the caller and never written back.
"""

from __future__ import annotations

import enum
import struct
from typing import Any

import msgspec

from rdmad.kernel.netlink.nlcodec import attr, get_u32, iter_attrs, nested
from rdmad.model import VfSettings

# linux/if_link.h
IFLA_VF_INFO = 1
IFLA_VF_MAC = 1
IFLA_VF_VLAN = 2
IFLA_VF_TX_RATE = 3  # obsolete max-rate-only attribute: never sent
IFLA_VF_SPOOFCHK = 4
IFLA_VF_LINK_STATE = 5
IFLA_VF_RATE = 6
IFLA_VF_RSS_QUERY_EN = 7
IFLA_VF_TRUST = 9
IFLA_VF_VLAN_LIST = 12
IFLA_VF_VLAN_INFO = 1

ETH_P_8021Q = 0x8100
ETH_P_8021AD = 0x88A8
VLAN_PROTOS = {ETH_P_8021Q: "802.1Q", ETH_P_8021AD: "802.1ad"}
PROTO_NUMBERS = {name: number for number, name in VLAN_PROTOS.items()}
DEFAULT_VLAN_PROTO = "802.1Q"
LINK_STATES = ("auto", "enable", "disable")  # IFLA_VF_LINK_STATE_AUTO/ENABLE/DISABLE
_UNSET = 0xFFFFFFFF  # the kernel pre-fills spoofchk/trust/rss_query with -1 ("not reported")

# The kernel's structs. Every one starts with ``__u32 vf``.
MAC = struct.Struct("=I32s")  # struct ifla_vf_mac { __u32 vf; __u8 mac[32]; }
VLAN = struct.Struct("=III")  # struct ifla_vf_vlan { __u32 vf, vlan, qos; }
# struct ifla_vf_vlan_info { __u32 vf, vlan, qos; __be16 vlan_proto; } (+2 padding = 16)
VLAN_INFO = struct.Struct("=III2s2x")
RATE = struct.Struct("=III")  # struct ifla_vf_rate { __u32 vf, min_tx_rate, max_tx_rate; }
SETTING = struct.Struct("=II")  # ifla_vf_spoofchk / _trust / _rss_query_en / _link_state


class VfAttr(enum.IntEnum):
    """One IFLA_VF_* attribute as rdmad writes it, in the order do_setvfinfo() applies them."""

    MAC = IFLA_VF_MAC
    VLAN = IFLA_VF_VLAN  # sent as IFLA_VF_VLAN_LIST when the protocol is 802.1ad
    RATE = IFLA_VF_RATE
    SPOOFCHK = IFLA_VF_SPOOFCHK
    LINK_STATE = IFLA_VF_LINK_STATE
    QUERY_RSS = IFLA_VF_RSS_QUERY_EN
    TRUST = IFLA_VF_TRUST

    @property
    def label(self) -> str:
        return VF_ATTR_NAMES[self]


# The name every log line and error uses for an attribute.
VF_ATTR_NAMES: dict[VfAttr, str] = {
    VfAttr.MAC: "mac",
    VfAttr.VLAN: "vlan",
    VfAttr.RATE: "rate",
    VfAttr.SPOOFCHK: "spoofchk",
    VfAttr.LINK_STATE: "link_state",
    VfAttr.QUERY_RSS: "query_rss",
    VfAttr.TRUST: "trust",
}
ORDER: tuple[VfAttr, ...] = tuple(VfAttr.__members__.values())

# Which VfSettings fields each attribute carries (vlan/qos/proto and the rates share one).
FIELDS: dict[VfAttr, tuple[str, ...]] = {
    VfAttr.MAC: ("mac",),
    VfAttr.VLAN: ("vlan", "qos", "vlan_proto"),
    VfAttr.RATE: ("min_tx_rate", "max_tx_rate"),
    VfAttr.SPOOFCHK: ("spoofchk",),
    VfAttr.LINK_STATE: ("link_state",),
    VfAttr.QUERY_RSS: ("query_rss",),
    VfAttr.TRUST: ("trust",),
}
ATTR_OF_FIELD: dict[str, VfAttr] = {f: a for a, fields in FIELDS.items() for f in fields}


class VfVlan(msgspec.Struct, frozen=True):
    vlan: int
    qos: int
    proto: str  # "802.1Q" | "802.1ad"


class VfRate(msgspec.Struct, frozen=True):
    min_tx_rate: int
    max_tx_rate: int


class VfRecord(msgspec.Struct, frozen=True):
    """What to write to one VF: a field left None is not sent."""

    vf: int
    mac: str | None = None
    vlan: VfVlan | None = None
    rate: VfRate | None = None
    spoofchk: bool | None = None
    link_state: str | None = None
    query_rss: bool | None = None
    trust: bool | None = None

    def value(self, which: VfAttr) -> Any:
        return getattr(self, VF_ATTR_NAMES[which])

    def attrs(self) -> tuple[VfAttr, ...]:
        """The attributes this record sets, in kernel order."""
        return tuple(a for a in ORDER if self.value(a) is not None)


def describe(record: VfRecord, which: VfAttr) -> str:
    """What one attribute of a record sends, for messages: "vlan 100 qos 0 proto 802.1ad"."""
    value = record.value(which)
    if isinstance(value, VfVlan):
        return f"vlan {value.vlan} qos {value.qos} proto {value.proto}"
    if isinstance(value, VfRate):
        return f"rate {value.min_tx_rate}-{value.max_tx_rate}"
    if isinstance(value, bool):
        return f"{which.label} {'on' if value else 'off'}"
    return f"{which.label} {value}"


def encode_attr(record: VfRecord, which: VfAttr) -> bytes:
    """One IFLA_VF_* attribute of a record, packed from the kernel's struct."""
    vf, value = record.vf, record.value(which)
    if which is VfAttr.MAC:
        raw = bytes(int(octet, 16) for octet in str(value).split(":"))
        return attr(IFLA_VF_MAC, MAC.pack(vf, raw))
    if which is VfAttr.VLAN:
        if value.proto == DEFAULT_VLAN_PROTO:  # the old attribute: understood by every driver
            return attr(IFLA_VF_VLAN, VLAN.pack(vf, value.vlan, value.qos))
        proto = struct.pack("!H", PROTO_NUMBERS[value.proto])
        info = attr(IFLA_VF_VLAN_INFO, VLAN_INFO.pack(vf, value.vlan, value.qos, proto))
        return nested(IFLA_VF_VLAN_LIST, [info])
    if which is VfAttr.RATE:
        return attr(IFLA_VF_RATE, RATE.pack(vf, value.min_tx_rate, value.max_tx_rate))
    if which is VfAttr.LINK_STATE:
        return attr(IFLA_VF_LINK_STATE, SETTING.pack(vf, LINK_STATES.index(value)))
    return attr(int(which), SETTING.pack(vf, int(bool(value))))


def encode_vf_info(record: VfRecord, only: tuple[VfAttr, ...] | None = None) -> bytes:
    """One IFLA_VF_INFO with the record's attributes (or just ``only``), in kernel order."""
    chosen = record.attrs() if only is None else tuple(a for a in ORDER if a in only)
    return nested(IFLA_VF_INFO, [encode_attr(record, a) for a in chosen])


# --- decoding -------------------------------------------------------------------------------


def _flag(value: bytes) -> bool | None:
    setting = get_u32(value, 4)
    return None if setting == _UNSET else bool(setting)


def proto_name(number: int) -> str:
    """ "802.1Q", "802.1ad", or the number in hex for anything else (e.g. "0x0000")."""
    return VLAN_PROTOS.get(number, f"0x{number:04x}")


def decode_vf_info(data: bytes) -> tuple[int | None, VfSettings]:
    """One IFLA_VF_INFO as the kernel reports it in RTM_NEWLINK.

    The VF index is the ``vf`` field of IFLA_VF_MAC, as iproute2 reads it: the kernel
    always sends that attribute, while others (IFLA_VF_BROADCAST, IFLA_VF_STATS) do not
    start with the index. None when IFLA_VF_MAC is missing.
    """
    vf: int | None = None
    s: dict[str, Any] = {}
    for atype, v in iter_attrs(data):
        if atype == IFLA_VF_MAC and len(v) >= 10:
            vf = get_u32(v)
            s["mac"] = ":".join(f"{b:02x}" for b in v[4:10])
        elif atype == IFLA_VF_VLAN and len(v) >= VLAN.size:
            _, s["vlan"], s["qos"] = VLAN.unpack_from(v)
            s.setdefault("vlan_proto", DEFAULT_VLAN_PROTO)
        elif atype == IFLA_VF_VLAN_LIST:
            for itype, info in iter_attrs(v):
                if itype == IFLA_VF_VLAN_INFO and len(info) >= 14:
                    _, s["vlan"], s["qos"] = VLAN.unpack_from(info)
                    (proto,) = struct.unpack_from("!H", info, 12)
                    s["vlan_proto"] = proto_name(proto)
                    break
        elif atype == IFLA_VF_RATE and len(v) >= RATE.size:
            _, s["min_tx_rate"], s["max_tx_rate"] = RATE.unpack_from(v)
        elif atype == IFLA_VF_SPOOFCHK and len(v) >= SETTING.size:
            s["spoofchk"] = _flag(v)
        elif atype == IFLA_VF_TRUST and len(v) >= SETTING.size:
            s["trust"] = _flag(v)
        elif atype == IFLA_VF_RSS_QUERY_EN and len(v) >= SETTING.size:
            s["query_rss"] = _flag(v)
        elif atype == IFLA_VF_LINK_STATE and len(v) >= SETTING.size:
            state = get_u32(v, 4)
            s["link_state"] = LINK_STATES[state] if state < len(LINK_STATES) else str(state)
    return vf, VfSettings(**s)


def decode_vfinfo_list(data: bytes) -> dict[int, VfSettings]:
    """IFLA_VFINFO_LIST: settings by VF index (entries without an index are skipped)."""
    vfs: dict[int, VfSettings] = {}
    for atype, entry in iter_attrs(data):
        if atype == IFLA_VF_INFO:
            vf, settings = decode_vf_info(entry)
            if vf is not None:
                vfs[vf] = settings
    return vfs
