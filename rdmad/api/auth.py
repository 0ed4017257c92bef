"""Who may ask: the peer's kernel credentials (SO_PEERCRED) against ``[api]`` groups.

Never anything the client sends. Reads (GET) are for root and members of
``read_group``; mutations for root and members of ``write_group`` (if one is
configured). The peer's groups are the ones it had when it connected
(SO_PEERGROUPS); where the kernel lacks that, its /proc/PID/status, as long as
that process still has the uid that connected; failing both, the uid's groups
from the group database.
"""

from __future__ import annotations

import os
import pwd
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from rdmad.api.errors import json_error

log = structlog.get_logger("rdmad.api")

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13
_MAX_GROUPS_BYTES = 4 * 4096
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Peer(msgspec.Struct, frozen=True):
    pid: int
    uid: int
    gid: int
    groups: frozenset[int]  # supplementary groups and the primary gid

    def member(self, gid: int | None) -> bool:
        return gid is not None and gid in self.groups


class Policy(msgspec.Struct, frozen=True):
    read_gid: int | None  # None: no such group, reads are for root only
    write_gid: int | None  # None: mutations are for root only

    def allows(self, peer: Peer, mutation: bool) -> bool:
        if peer.uid == 0:
            return True
        if mutation:
            return peer.member(self.write_gid)
        return peer.member(self.read_gid) or peer.member(self.write_gid)


PEER = web.RequestKey("peer", Peer)  # the caller's credentials, for handlers that log


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end (the accept loop's per-user bound)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    uid: int = _UCRED.unpack(raw)[1]
    return uid


def peer_of(sock: Any) -> Peer:
    """The credentials of the process at the other end of a connected UNIX socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    groups = _peer_groups(sock, pid, uid, gid)
    return Peer(pid, uid, gid, groups | {gid})


def _peer_groups(sock: Any, pid: int, uid: int, gid: int) -> frozenset[int]:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, _MAX_GROUPS_BYTES)
    except OSError:
        pass
    else:
        n = len(raw) // 4
        return frozenset(struct.unpack(f"{n}I", raw[: n * 4]))
    from_proc = _proc_groups(pid, uid)
    if from_proc is not None:
        return from_proc
    try:
        return frozenset(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
    except (KeyError, OSError):
        return frozenset()


def _proc_groups(pid: int, uid: int) -> frozenset[int] | None:
    """``Groups:`` of /proc/PID/status, if that pid still runs as ``uid`` (a reused pid
    must not lend its groups)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    try:
        real_uid = int(fields["Uid"].split()[0])
        groups = frozenset(int(g) for g in fields.get("Groups", "").split())
    except (KeyError, ValueError, IndexError):
        return None
    return groups if real_uid == uid else None


def middleware(policy: Policy) -> Middleware:
    """aiohttp middleware: 403 (JSON, logged with uid and pid) unless the policy allows."""

    @web.middleware
    async def authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        try:
            peer = peer_of(sock)
        except (OSError, AttributeError, struct.error) as exc:
            log.warning("api.denied", reason=f"no peer credentials: {exc}", path=request.path)
            return json_error(403, "cannot read the caller's credentials")
        request[PEER] = peer
        mutation = request.method not in READ_METHODS
        if not policy.allows(peer, mutation):
            what = "change anything" if mutation else "read"
            log.warning(
                "api.denied",
                uid=peer.uid,
                pid=peer.pid,
                method=request.method,
                path=request.path,
            )
            return json_error(
                403, f"uid {peer.uid} may not {what} here (see [api] read_group/write_group)"
            )
        return await handler(request)

    return authorize
