"""The netlink socket transport shared by rtnetlink, link events and RDMA netlink.

Hand-written instead of pyroute2's ``AsyncIPRoute`` socket because rdmad needs what
that one does not give: a socket opened inside a named network namespace without
forking, an ENOBUFS that is reported (link events then resync) instead of marking the
whole object dead, and replies matched by sequence number so a cancelled request cannot
confuse the next. Everything is asyncio-native: a non-blocking socket read with
``loop.add_reader`` (no thread, no polling); except ``request_blocking``, for the
generic netlink requests the kernel runs inside the sender's sendmsg (devlink), which
run in a worker thread so that the event loop never waits on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import mmap
import os
import select
import socket
import struct
import threading

from rdmad.kernel.netlink.nlcodec import (
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_DUMP_INTR,
    NLM_F_MULTI,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    NlMsg,
    pack_message,
    parse_error,
    split_messages,
)

SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11
SO_RCVBUFFORCE = 33
CLONE_NEWNET = 0x40000000
RECV_BUF = 1 << 20


def receive_buffer() -> mmap.mmap:
    """A RECV_BUF receive buffer whose pages become resident only as datagrams reach
    them (an anonymous mapping). A bytearray of that size is zero-filled when it is
    made: 1 MiB resident per socket for the life of the daemon, four of them 4 MiB of
    an idle daemon's RSS, for datagrams that are rarely over 32 KiB (the kernel's
    dump size), though one link's VF list can be far larger."""
    return mmap.mmap(-1, RECV_BUF)


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
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {path}: {os.strerror(err)}")
            finally:
                os.close(fd)
            box.append(socket.socket(family, stype | socket.SOCK_CLOEXEC, proto))
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
        ask_extended_acks(sock)
        sock.bind((0, groups))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def open_request_socket(protocol: int) -> socket.socket:
    """A non-blocking netlink socket for one request and its answer, in three system
    calls where ``open_netlink_socket`` makes six: non-blocking and close-on-exec from
    its creation, not bound (the kernel binds it at the first send), the default receive
    buffer (an acknowledgement is small); extended and capped acks all the same. For
    the rxe reflex, which opens one on the event path (kernel.events.reflex)."""
    sock = socket.socket(
        socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK, protocol
    )
    ask_extended_acks(sock)
    return sock


def ask_extended_acks(sock: socket.socket) -> None:
    """Errors with the kernel's text (extended acks), acks without the request copied
    back (capped); an old kernel without them answers errors without text."""
    for opt in (NETLINK_EXT_ACK, NETLINK_CAP_ACK):
        with contextlib.suppress(OSError):
            sock.setsockopt(SOL_NETLINK, opt, 1)


def set_rcvbuf(sock: socket.socket, size: int) -> None:
    """SO_RCVBUFFORCE (root may exceed net.core.rmem_max), else SO_RCVBUF."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, size)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


async def readable(sock: socket.socket) -> None:
    """Wait until the socket has something to read."""
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


def recv_nowait(sock: socket.socket, buf: bytearray | mmap.mmap) -> bytes | None:
    """One datagram, or None when nothing is queued. ENOBUFS and others raise OSError."""
    try:
        n, _, flags, _ = sock.recvmsg_into([buf])
    except BlockingIOError:
        return None
    if flags & socket.MSG_TRUNC:
        raise OSError(errno.EMSGSIZE, "netlink datagram larger than the receive buffer")
    return bytes(buf[:n])  # an mmap's slice is bytes already: no second copy


class NetlinkTransport:
    """Request/response over one netlink socket, usable from any running event loop."""

    def __init__(self, protocol: int, netns: str | None = None) -> None:
        self._protocol = protocol
        self._netns = netns
        self._sock: socket.socket | None = None
        self._buf = receive_buffer()
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
            sock.send(pack_message(mtype, flags, seq, payload))
            return await self._collect(sock, seq)

    async def _collect(self, sock: socket.socket, seq: int) -> list[NlMsg]:
        replies: list[NlMsg] = []
        while True:
            data = recv_nowait(sock, self._buf)
            if data is None:
                await readable(sock)
                continue
            if _take(data, seq, replies):
                return replies

    def request_blocking(
        self, mtype: int, flags: int, payload: bytes, reply_wait: float
    ) -> list[NlMsg]:
        """``request`` for a worker thread, never the event loop, and never beside a
        ``request`` on the same transport. The kernel runs a generic netlink request
        inside the sender's sendmsg (a devlink eSwitch mode change: seconds), so the
        send is what blocks; the replies are then read, each waited for at most
        ``reply_wait`` seconds."""
        sock = self.get_socket()
        seq = self.next_seq()
        flags |= NLM_F_REQUEST if flags & NLM_F_DUMP else NLM_F_REQUEST | NLM_F_ACK
        sock.send(pack_message(mtype, flags, seq, payload))
        replies: list[NlMsg] = []
        while True:
            data = recv_nowait(sock, self._buf)
            if data is None:
                ready, _, _ = select.select([sock], [], [], reply_wait)
                if not ready:
                    raise NetlinkFailure(errno.ETIMEDOUT, f"no reply within {reply_wait:g} s")
                continue
            if _take(data, seq, replies):
                return replies


def _take(data: bytes, seq: int, replies: list[NlMsg]) -> bool:
    """Add a datagram's replies to ``seq`` to ``replies``; True once the request is
    answered (its ack or the dump's end), NetlinkFailure when it failed."""
    for msg in split_messages(data):
        if msg.seq != seq:
            continue  # late reply to a cancelled request
        if msg.type == NLMSG_ERROR:
            code, text = parse_error(msg)
            if code:
                raise NetlinkFailure(code, text)
            return True
        if msg.type == NLMSG_DONE:
            code = -struct.unpack_from("=i", msg.data, 0)[0] if msg.data else 0
            if code:
                raise NetlinkFailure(code, "dump failed")
            if msg.flags & NLM_F_DUMP_INTR:
                raise NetlinkFailure(errno.EINTR, "dump interrupted by a change")
            return True
        replies.append(msg)
        if not msg.flags & NLM_F_MULTI:
            return True  # a single answer (its ack, if any, is dropped by seq later)
    return False
