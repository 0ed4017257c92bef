"""Encoding and decoding of RDMA netlink (nldev) messages, without a kernel."""

from __future__ import annotations

import errno
import struct

import pytest

from rdmad.kernel import rdma
from rdmad.kernel.errors import KernelError
from rdmad.kernel.netlink import NetlinkFailure, NlMsg, split_messages

NLMSG_ERROR = 2


def nla(atype: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes: built by hand, independent of pyroute2."""
    raw = struct.pack("=HH", 4 + len(payload), atype) + payload
    return raw + b"\0" * (-len(raw) % 4)


def message(mtype: int, flags: int, seq: int, body: bytes) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), mtype, flags, seq, 1234) + body


def test_message_types_follow_rdma_nl_get_type() -> None:
    # RDMA_NL_GET_TYPE(RDMA_NL_NLDEV=5, op) = (5 << 10) + op
    assert rdma.nldev_type(rdma.CMD_GET) == 0x1401
    assert rdma.nldev_type(rdma.CMD_NEWLINK) == 0x1403
    assert rdma.nldev_type(rdma.CMD_DELLINK) == 0x1404
    assert rdma.nldev_type(rdma.CMD_PORT_GET) == 0x1405


def test_attribute_numbers_match_the_uapi_header() -> None:
    # include/uapi/rdma/rdma_netlink.h, enum rdma_nldev_attr (counted by hand)
    assert (rdma.ATTR_DEV_INDEX, rdma.ATTR_DEV_NAME, rdma.ATTR_PORT_INDEX) == (1, 2, 3)
    assert (rdma.ATTR_NDEV_INDEX, rdma.ATTR_NDEV_NAME) == (50, 51)
    assert rdma.ATTR_LINK_TYPE == 65
    assert rdma.ATTR_CHARDEV_TYPE == 69
    assert rdma.ATTR_UVERBS_DRIVER_ID == 73
    assert rdma.DRIVER_NAMES[14] == "rxe"


def test_newlink_bytes_are_exactly_what_the_kernel_expects() -> None:
    data = rdma.encode(rdma.CMD_NEWLINK, rdma.newlink_attrs("rxe0", "rxe", "eth0"))
    body = nla(2, b"rxe0\0") + nla(65, b"rxe\0") + nla(51, b"eth0\0")
    length, mtype = struct.unpack_from("=IH", data)
    assert (length, mtype) == (len(data), 0x1403)
    assert data[16:] == body  # no family header: attributes follow nlmsghdr directly


def test_newlink_round_trip() -> None:
    data = rdma.encode(rdma.CMD_NEWLINK, rdma.newlink_attrs("rxe_eth1", "rxe", "enp1s0v3"))
    msg = rdma.decode(data)
    assert msg["header"]["type"] == rdma.nldev_type(rdma.CMD_NEWLINK)
    assert msg.get_attr("RDMA_NLDEV_ATTR_DEV_NAME") == "rxe_eth1"
    assert msg.get_attr("RDMA_NLDEV_ATTR_LINK_TYPE") == "rxe"
    assert msg.get_attr("RDMA_NLDEV_ATTR_NDEV_NAME") == "enp1s0v3"


def test_dellink_carries_the_device_index() -> None:
    data = rdma.encode(rdma.CMD_DELLINK, [("RDMA_NLDEV_ATTR_DEV_INDEX", 7)])
    assert data[16:] == nla(1, struct.pack("=I", 7))


def canned_dump() -> bytes:
    """A GET dump reply for two devices, as the kernel sends it (plus attrs we ignore)."""
    multi = 0x2
    dev0 = (
        nla(1, struct.pack("=I", 0))
        + nla(2, b"mlx5_0\0")
        + nla(3, struct.pack("=I", 1))
        + nla(4, struct.pack("=Q", 0x1234))  # CAP_FLAGS (not in our map)
        + nla(67, b"roce\0")
    )
    dev1 = nla(1, struct.pack("=I", 3)) + nla(2, b"rxe0\0") + nla(3, struct.pack("=I", 1))
    done = struct.pack("=i", 0)
    return (
        message(0x1401, multi, 42, dev0)
        + message(0x1401, multi, 42, dev1)
        + message(3, multi, 42, done)
    )


def test_parse_canned_dump_reply() -> None:
    msgs = split_messages(canned_dump())
    assert [m.type for m in msgs] == [0x1401, 0x1401, 3]
    devices = [rdma.decode_reply(m) for m in msgs[:2]]
    assert [
        (d.get_attr("RDMA_NLDEV_ATTR_DEV_INDEX"), d.get_attr("RDMA_NLDEV_ATTR_DEV_NAME"))
        for d in devices
    ] == [(0, "mlx5_0"), (3, "rxe0")]
    assert devices[0].get_attr("RDMA_NLDEV_ATTR_DEV_PROTOCOL") == "roce"


def test_parse_port_reply_with_netdev() -> None:
    body = (
        nla(1, struct.pack("=I", 3))
        + nla(2, b"rxe0\0")
        + nla(3, struct.pack("=I", 1))
        + nla(12, b"\x04")
        + nla(50, struct.pack("=I", 9))
        + nla(51, b"enp1s0\0")
    )
    [msg] = split_messages(message(0x1405, 0, 5, body))
    port = rdma.decode_reply(msg)
    assert port.get_attr("RDMA_NLDEV_ATTR_NDEV_INDEX") == 9
    assert port.get_attr("RDMA_NLDEV_ATTR_NDEV_NAME") == "enp1s0"
    assert port.get_attr("RDMA_NLDEV_ATTR_PORT_STATE") == 4


def test_chardev_reply_names_the_driver() -> None:
    body = nla(69, b"uverbs\0") + nla(70, b"uverbs0\0") + nla(73, struct.pack("=I", 14))
    [msg] = split_messages(message(0x140F, 0, 6, body))
    driver_id = rdma.decode_reply(msg).get_attr("RDMA_NLDEV_ATTR_UVERBS_DRIVER_ID")
    assert rdma.DRIVER_NAMES[driver_id] == "rxe"


def test_error_with_extack_text_is_parsed() -> None:
    from rdmad.kernel.netlink import parse_error

    request = message(0x1403, 0x5, 9, b"")
    ack_tlvs, capped = 0x200, 0x100
    body = struct.pack("=i", -errno.EEXIST) + request + nla(1, b"already configured\0")
    [msg] = split_messages(message(NLMSG_ERROR, ack_tlvs | capped, 9, body))
    assert parse_error(msg) == (errno.EEXIST, "already configured")


def test_add_error_message_names_link_netdev_and_errno() -> None:
    exc = rdma._error(
        "add rxe link rxe0", "netdev eth9", NetlinkFailure(errno.ENODEV), rdma._ADD_HINTS
    )
    assert isinstance(exc, KernelError)
    assert str(exc) == (
        "add rxe link rxe0 on netdev eth9: no such device (ENODEV); the netdev does not exist"
    )


def test_unavailable_kernel_is_graceful() -> None:
    client = rdma.RdmaNetlink()
    try:
        ok = client.available()
    finally:
        client.close()
    if ok:
        pytest.skip("this kernel has NETLINK_RDMA")
    assert client.reason is not None and "NETLINK_RDMA" in client.reason


def test_nlmsg_dataclass_is_plain() -> None:
    assert NlMsg(1, 2, 3, b"x").data == b"x"
