"""Netdevs that live in other network namespaces, seen from this one without entering them.

A VF whose netdev was moved into a container or an ``ip netns`` namespace vanishes
from this namespace's sysfs; to say *where* it went (a holder an operator can act
on), rdmad asks rtnetlink in its own namespace:

* ``RTM_GETNSID`` (dump) lists the ids this namespace has for its peers. The kernel
  assigns one when a device is moved out (``__dev_change_net_namespace`` announces
  the move with the new namespace's id), so a moved VF's namespace always has one.
* ``RTM_GETLINK`` with ``IFLA_TARGET_NETNSID`` dumps the links of that peer; since
  kernel 5.14 each carries ``IFLA_PARENT_DEV_NAME`` (the PCI address for a PCI
  function's netdev).
* ``RTM_GETNSID`` with ``NETNSA_FD`` maps a namespace file (``/run/netns/NAME``,
  ``/proc/PID/ns/net``) to its id, to name the namespace.

No ``setns()``: rdmad's unit runs with ``RestrictNamespaces=yes``, and entering a
namespace from a daemon thread is a side effect nobody needs. Hand-written because
these three small synchronous queries are all that is needed, on the same netlink
framing (``nlcodec``) as the rest of rdmad, which does not depend on pyroute2 at run
time (its package import alone costs ~0.2 s and ~25 MB); nothing here writes to the
kernel (no ``RTM_NEWNSID``).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterator
from typing import NamedTuple

from rdmad.kernel.errors import KernelError
from rdmad.kernel.netlink.nlcodec import (
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    attr,
    cstr,
    iter_attrs,
    pack_message,
    parse_error,
    split_messages,
)

NETLINK_ROUTE = 0
RTM_GETLINK = 18
RTM_GETNSID = 90
NETNSA_NSID = 1
NETNSA_FD = 3
IFLA_IFNAME = 3
IFLA_TARGET_NETNSID = 46
IFLA_PARENT_DEV_NAME = 56
IFLA_PARENT_DEV_BUS_NAME = 57

_IFINFO = struct.Struct("=BxHiII")  # family, type, index, flags, change
_RTGEN = struct.Struct("=Bxxx")  # rtgenmsg padded to 4


class ForeignNetdev(NamedTuple):
    nsid: int  # this namespace's id for the namespace the netdev lives in
    name: str
    parent: str | None  # parent device, e.g. the VF's PCI address
    parent_bus: str | None  # "pci", ...


class NetnsQuery:
    """One rtnetlink socket in this namespace for the queries above (use as a context)."""

    def __init__(self, timeout: float = 2.0) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        self._sock.settimeout(timeout)
        self._sock.bind((0, 0))
        self._seq = 0

    def __enter__(self) -> NetnsQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def _request(self, kind: int, flags: int, body: bytes) -> Iterator[bytes]:
        """Send one request; yield each reply's payload (after the netlink header)."""
        self._seq += 1
        seq = self._seq
        self._sock.send(pack_message(kind, flags, seq, body))
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError as exc:
                raise KernelError("rtnetlink query", str(kind), exc.errno or 0, str(exc)) from exc
            for msg in split_messages(data):
                if msg.seq != seq:
                    continue
                if msg.type == NLMSG_DONE:
                    return
                if msg.type == NLMSG_ERROR:
                    code, text = parse_error(msg)
                    if code == 0:
                        return  # an ACK
                    raise KernelError("rtnetlink query", str(kind), code, text or os.strerror(code))
                yield msg.data
                if not flags & NLM_F_DUMP:
                    return

    def nsids(self) -> list[int]:
        """The ids this namespace has assigned to its peers."""
        out = []
        for payload in self._request(RTM_GETNSID, NLM_F_REQUEST | NLM_F_DUMP, _RTGEN.pack(0)):
            for kind, value in iter_attrs(payload[_RTGEN.size :]):
                if kind == NETNSA_NSID:
                    nsid = struct.unpack("=i", value[:4])[0]
                    if nsid >= 0:
                        out.append(nsid)
        return sorted(set(out))

    def nsid_of(self, ns_file: str) -> int | None:
        """This namespace's id for the namespace ``ns_file`` stands for; None if it has none."""
        try:
            fd = os.open(ns_file, os.O_RDONLY)
        except OSError:
            return None
        try:
            body = _RTGEN.pack(0) + attr(NETNSA_FD, struct.pack("=I", fd))
            for payload in self._request(RTM_GETNSID, NLM_F_REQUEST, body):
                for kind, value in iter_attrs(payload[_RTGEN.size :]):
                    if kind == NETNSA_NSID:
                        nsid = int(struct.unpack("=i", value[:4])[0])
                        return nsid if nsid >= 0 else None
        except KernelError as exc:
            if exc.errno in (errno.EINVAL, errno.EBADF):
                return None  # not a network namespace file
            raise
        finally:
            os.close(fd)
        return None

    def netdevs_in(self, nsid: int) -> list[ForeignNetdev]:
        body = _IFINFO.pack(0, 0, 0, 0, 0) + attr(IFLA_TARGET_NETNSID, struct.pack("=i", nsid))
        out = []
        for payload in self._request(RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, body):
            found = dict(iter_attrs(payload[_IFINFO.size :]))
            name = found.get(IFLA_IFNAME)
            if name is None:
                continue
            parent = found.get(IFLA_PARENT_DEV_NAME)
            bus = found.get(IFLA_PARENT_DEV_BUS_NAME)
            out.append(
                ForeignNetdev(
                    nsid=nsid,
                    name=cstr(name),
                    parent=cstr(parent) if parent is not None else None,
                    parent_bus=cstr(bus) if bus is not None else None,
                )
            )
        return out

    def foreign_netdevs(self) -> list[ForeignNetdev]:
        """Every netdev in every peer namespace this one has an id for."""
        out = []
        for nsid in self.nsids():
            try:
                out.extend(self.netdevs_in(nsid))
            except KernelError:
                continue  # the namespace went away between the two queries
        return out
