"""Applying VF changes: batched RTM_SETLINK, per-VF/per-attribute fallback, read-back check.

The kernel applies the IFLA_VF_INFO entries of one RTM_SETLINK in order and stops at
the first error, keeping what it applied; it does not say which entry failed. So a
refused batch is retried one VF at a time, and a refused VF one attribute at a time
(re-sending values the batch already applied is harmless), as systemd's netif-sriov.c
sends each attribute as its own piece. A driver may also accept a value and keep
another (a rate it rounds, a setting it ignores): after writing, the PF's VF list is
read back and a change that reads differently is reported failed, per attribute.

The socket is not here: ``apply_vf_changes`` gets a ``send`` and a ``read_back``
callable, so this logic is tested without a kernel and shared by every caller.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec

from rdmad.kernel.errors import KernelError
from rdmad.kernel.netlink.nlsock import NetlinkFailure
from rdmad.kernel.netlink.rtnl_codec import encode_setlink_vfs
from rdmad.kernel.netlink.rtnl_vf_attrs import (
    ATTR_OF_FIELD,
    DEFAULT_VLAN_PROTO,
    FIELDS,
    LINK_STATES,
    ORDER,
    PROTO_NUMBERS,
    VfAttr,
    VfRate,
    VfRecord,
    VfVlan,
    describe,
    encode_vf_info,
)
from rdmad.model import VfChange, VfSettings

log = logging.getLogger("rdmad.kernel")


class VfChangeResult(msgspec.Struct, frozen=True):
    """What became of one requested ``VfChange``: applied (``error`` None) or why not."""

    change: VfChange
    error: KernelError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Piece(msgspec.Struct, frozen=True):
    """One attribute of one VF: what travels as one IFLA_VF_* and can fail on its own."""

    record: VfRecord
    attr: VfAttr
    changes: tuple[VfChange, ...]  # the requested changes it carries
    text: str  # what was sent, for messages: "vlan 100 qos 0 proto 802.1ad"

    @property
    def vf(self) -> int:
        return self.record.vf


def _is_int(value: object, low: int, high: int | None = None) -> bool:
    return isinstance(value, int) and value >= low and (high is None or value <= high)


_HEX = frozenset("0123456789abcdefABCDEF")


def _is_mac(value: object) -> bool:
    if not isinstance(value, str):
        return False
    octets = value.split(":")
    return len(octets) == 6 and all(len(o) == 2 and _HEX.issuperset(o) for o in octets)


# One check per attribute, looked up: validate() runs once per change, thousands of
# times for a few hundred VFs, so it must not build every check for each one.
_VALID: dict[str, Callable[[object], bool]] = {
    "mac": _is_mac,
    "vlan": lambda v: _is_int(v, 0, 4095),
    "qos": lambda v: _is_int(v, 0, 7),
    "vlan_proto": lambda v: v in PROTO_NUMBERS,
    "min_tx_rate": lambda v: _is_int(v, 0),
    "max_tx_rate": lambda v: _is_int(v, 0),
    "link_state": lambda v: v in LINK_STATES,
}


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def validate(change: VfChange) -> str | None:
    """Why a change cannot be encoded at all, or None."""
    name, new = change.attr, change.new
    if name not in ATTR_OF_FIELD:
        return f"unknown VF attribute {name!r}"
    return None if _VALID.get(name, _is_bool)(new) else f"cannot set {name} to {new!r}"


def _record(vf: int, which: VfAttr, new: Mapping[str, object], cur: VfSettings) -> VfRecord:
    """The record for one attribute: changed fields as declared, the others kept or default.

    A field travelling with a changed one (qos with vlan, min with max rate) keeps its
    current value. A VLAN protocol is sent as declared, else as read back when that is
    a protocol, else 802.1Q, the documented default: a protocol the kernel reports as
    something else (netdevsim's fresh VFs say 0) is never written back.
    """

    def keep(name: str, default: int) -> int:
        value = new.get(name, getattr(cur, name))
        return value if isinstance(value, int) else default

    if which is VfAttr.VLAN:
        if "vlan_proto" in new:
            proto = str(new["vlan_proto"])
        elif cur.vlan_proto in PROTO_NUMBERS:
            proto = str(cur.vlan_proto)
        else:
            proto = DEFAULT_VLAN_PROTO
            if cur.vlan_proto is not None:
                log.warning(
                    "vf %d vlan: protocol reads %s, not written back; sending %s",
                    vf,
                    cur.vlan_proto,
                    proto,
                )
        return VfRecord(vf, vlan=VfVlan(keep("vlan", 0), keep("qos", 0), proto))
    if which is VfAttr.RATE:
        return VfRecord(vf, rate=VfRate(keep("min_tx_rate", 0), keep("max_tx_rate", 0)))
    (name,) = FIELDS[which]
    value: Any = str(new[name]).lower() if which is VfAttr.MAC else new[name]
    return VfRecord(vf, **{name: value})


def plan_pieces(
    changes: Sequence[VfChange], current: Mapping[int, VfSettings]
) -> tuple[list[Piece], list[VfChangeResult]]:
    """Group changes into pieces (VF order, kernel order); reject what cannot be encoded."""
    rejected: list[VfChangeResult] = []
    grouped: dict[int, dict[VfAttr, list[VfChange]]] = {}
    for change in changes:
        why = validate(change)
        if why is not None:
            err = KernelError(f"set vf {change.vf} {change.attr}", "", None, why)
            rejected.append(VfChangeResult(change, err))
            continue
        grouped.setdefault(change.vf, {}).setdefault(ATTR_OF_FIELD[change.attr], []).append(change)
    pieces = []
    for vf in sorted(grouped):
        cur = current.get(vf) or VfSettings()
        for which in ORDER:
            mine = grouped[vf].get(which)
            if mine:
                record = _record(vf, which, {c.attr: c.new for c in mine}, cur)
                pieces.append(Piece(record, which, tuple(mine), describe(record, which)))
    return pieces, rejected


# IFLA_VFINFO_LIST's length is a u16: a batch must stay below 64 KiB. 40 bytes bounds one
# piece (IFLA_VF_MAC, the largest, is 4 + 36), 4 more per IFLA_VF_INFO: ~240 VFs with
# every attribute fit one message; larger sets go out as a few.
MAX_VFINFO_BYTES = 60_000


def split_batches(pieces: Sequence[Piece]) -> list[list[Piece]]:
    """Cut pieces (sorted by VF) into batches whose IFLA_VFINFO_LIST fits its u16 length."""
    batches: list[list[Piece]] = []
    size = MAX_VFINFO_BYTES + 1
    last_vf: int | None = None
    for p in pieces:
        cost = 40 + (4 if p.vf != last_vf else 0)
        if p.vf != last_vf and size + cost + 40 * len(ORDER) > MAX_VFINFO_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(p)
        size += cost
        last_vf = p.vf
    return batches


def encode_pieces(target: int | str, pieces: Sequence[Piece]) -> bytes:
    """One RTM_SETLINK payload: one IFLA_VF_INFO per VF holding its pieces, in kernel order."""
    # Fields gathered per VF, each record built once (a replace() per piece
    # was most of the cost of a few hundred VFs).
    by_vf: dict[int, dict[str, Any]] = {}
    for p in pieces:
        by_vf.setdefault(p.vf, {})[p.attr.label] = p.record.value(p.attr)
    records = [VfRecord(vf, **fields) for vf, fields in by_vf.items()]
    return encode_setlink_vfs(target, [encode_vf_info(r) for r in records])


# --- applying -------------------------------------------------------------------------------

Send = Callable[[Sequence[Piece]], Awaitable[NetlinkFailure | None]]
ReadBack = Callable[[], Awaitable[Mapping[int, VfSettings]]]


async def apply_vf_changes(
    send: Send,
    read_back: ReadBack,
    target: str,
    changes: Sequence[VfChange],
    current: Mapping[int, VfSettings],
) -> list[VfChangeResult]:
    """Apply changes in as few messages as the kernel accepts; verify; one result per change.

    ``target`` names the PF in messages. Results come back in the order of ``changes``.
    """
    pieces, rejected = plan_pieces(changes, current)
    outcome: dict[int, KernelError | None] = {
        id(r.change): _retarget(r.error, target) for r in rejected
    }
    written: list[VfChange] = []
    for batch in split_batches(pieces):
        for piece, failure in await _apply(send, batch):
            for change in piece.changes:
                outcome[id(change)] = _explain(failure, change, piece, target)
                if failure is None:
                    written.append(change)
    if written:
        for change, error in await _verify(read_back, written, target):
            outcome[id(change)] = error
    return [VfChangeResult(c, outcome.get(id(c))) for c in changes]


async def _apply(send: Send, pieces: list[Piece]) -> list[tuple[Piece, NetlinkFailure | None]]:
    error = await send(pieces)
    if error is None:
        return [(p, None) for p in pieces]
    vfs = sorted({p.vf for p in pieces})
    if len(pieces) == 1:
        return [(pieces[0], error)]
    out: list[tuple[Piece, NetlinkFailure | None]] = []
    for vf in vfs:
        mine = [p for p in pieces if p.vf == vf]
        vf_error = error if len(vfs) == 1 else await send(mine)
        if vf_error is None:
            out.extend((p, None) for p in mine)
        elif len(mine) == 1:
            out.append((mine[0], vf_error))
        else:
            for p in mine:
                out.append((p, await send([p])))
    return out


def _same(name: str, wrote: object, reads: object) -> bool:
    if name == "mac" and isinstance(wrote, str) and isinstance(reads, str):
        return wrote.lower() == reads.lower()
    return wrote == reads


async def _verify(
    read_back: ReadBack, written: list[VfChange], target: str
) -> list[tuple[VfChange, KernelError | None]]:
    """Each written change against what the PF reports now: "vf 3 max_tx_rate: wrote 100,
    reads 0" for a driver that accepted a value but keeps another."""
    try:
        vfs = await read_back()
    except KernelError as exc:
        why = f"written, but the VF list could not be read back: {exc}"
        return [(c, KernelError(f"vf {c.vf} {c.attr}", target, None, why)) for c in written]
    out: list[tuple[VfChange, KernelError | None]] = []
    for c in written:
        settings = vfs.get(c.vf)
        reads = None if settings is None else getattr(settings, c.attr)
        if _same(c.attr, c.new, reads):
            out.append((c, None))
            continue
        if settings is None:
            what = "the VF is missing from the PF's VF list read back"
        else:
            what = "reads nothing (not reported)" if reads is None else f"reads {reads}"
        log.warning("%s vf %d %s: wrote %s, %s", target, c.vf, c.attr, c.new, what)
        out.append((c, KernelError(f"vf {c.vf} {c.attr}", "", None, f"wrote {c.new}, {what}")))
    return out


_VF_HINTS: dict[tuple[str, int], str] = {
    ("vlan_proto", errno.EPROTONOSUPPORT): "the driver supports only 802.1Q VF VLANs",
    ("link_state", errno.EOPNOTSUPP): "the driver cannot force a VF's link state",
    ("query_rss", errno.EOPNOTSUPP): "the driver cannot expose RSS to the VF",
    ("min_tx_rate", errno.EINVAL): "the driver or link speed does not allow this rate",
    ("max_tx_rate", errno.EINVAL): "the driver or link speed does not allow this rate",
}


def _retarget(error: KernelError | None, target: str) -> KernelError | None:
    if error is None:
        return None
    return KernelError(error.op, target, error.errno, error.detail)


def _explain(
    failure: NetlinkFailure | None, change: VfChange, piece: Piece, target: str
) -> KernelError | None:
    """The refusal of one piece, told from the point of view of one change in it."""
    if failure is None:
        return None
    detail = [failure.message] if failure.message else []
    if len(FIELDS[piece.attr]) > 1:
        detail.append(f"sent together as {piece.text}")
    hint = _VF_HINTS.get((change.attr, failure.errno))
    if hint:
        detail.append(hint)
    log.info("%s vf %d %s refused: %s", target, piece.vf, piece.attr.label, failure.errno)
    return KernelError(
        f"set vf {change.vf} {change.attr}", target, failure.errno, "; ".join(detail)
    )
