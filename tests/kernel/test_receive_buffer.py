"""The netlink receive buffers: a whole datagram of any size fits, and the buffer costs
resident memory only where datagrams reached (an idle daemon keeps four of them)."""

from __future__ import annotations

import os
import socket
import struct

from rdmad.kernel.netlink.nlcodec import NLM_F_DUMP, NLM_F_REQUEST, pack_message, split_messages
from rdmad.kernel.netlink.nlsock import RECV_BUF, open_request_socket, receive_buffer, recv_nowait

PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def test_buffers_are_resident_only_where_a_datagram_reached() -> None:
    """64 buffers of RECV_BUF (64 MiB): made zero-filled, as a bytearray is, they would
    add all of it to RSS; these add a few pages at most."""
    before = resident_bytes()
    buffers = [receive_buffer() for _ in range(64)]
    grew = resident_bytes() - before
    assert all(len(b) == RECV_BUF for b in buffers)
    assert grew < 4 * 1024 * 1024, f"{grew} bytes resident for 64 untouched buffers"
    for b in buffers:
        b.close()


def test_a_dump_is_received_whole_into_one() -> None:
    """An RTM_GETLINK dump of this machine's links, read as the transports read."""
    sock = open_request_socket(socket.NETLINK_ROUTE)
    buf = receive_buffer()
    with sock:
        rtm_getlink, ifinfo = 18, struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)
        sock.send(pack_message(rtm_getlink, NLM_F_REQUEST | NLM_F_DUMP, 9, ifinfo))
        links, done = 0, False
        for _ in range(1000):  # bounded; the kernel queues the dump within the send
            data = recv_nowait(sock, buf)
            if data is None:
                break
            assert type(data) is bytes
            for msg in split_messages(data):
                done = done or msg.type == 3  # NLMSG_DONE
                links += msg.type == 16 and msg.seq == 9  # RTM_NEWLINK
        assert done and links >= 1  # lo at least
    buf.close()
