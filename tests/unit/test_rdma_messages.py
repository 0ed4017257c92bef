"""RDMA netlink (nldev) messages, resource users and the no-module-load rule, without a kernel.

The expected bytes are built by hand from the uapi header, independently of rdmad's codec.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from pathlib import Path

import pytest

from rdmad.kernel.errors import KernelError
from rdmad.kernel.netlink import rdma
from rdmad.kernel.netlink import rdma_codec as rcodec
from rdmad.kernel.netlink.nlcodec import NlMsg, parse_error, split_messages
from rdmad.kernel.netlink.nlsock import NetlinkFailure
from rdmad.kernel.netlink.rdma_usage import device_usage, usage_of
from rdmad.model import FREE, Use

NLMSG_ERROR = 2


def nla(atype: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes, built by hand."""
    raw = struct.pack("=HH", 4 + len(payload), atype) + payload
    return raw + b"\0" * (-len(raw) % 4)


def message(mtype: int, flags: int, seq: int, body: bytes) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), mtype, flags, seq, 1234) + body


def u32(v: int) -> bytes:
    return struct.pack("=I", v)


def test_message_types_follow_rdma_nl_get_type() -> None:
    # RDMA_NL_GET_TYPE(RDMA_NL_NLDEV=5, op) = (5 << 10) + op
    assert rcodec.nldev_type(rcodec.CMD_GET) == 0x1401
    assert rcodec.nldev_type(rcodec.CMD_NEWLINK) == 0x1403
    assert rcodec.nldev_type(rcodec.CMD_DELLINK) == 0x1404
    assert rcodec.nldev_type(rcodec.CMD_PORT_GET) == 0x1405
    assert rcodec.nldev_type(rcodec.CMD_RES_QP_GET) == 0x140A
    assert rcodec.nldev_type(rcodec.CMD_RES_CQ_GET) == 0x140C
    assert rcodec.nldev_type(rcodec.CMD_RES_PD_GET) == 0x140E


def test_attribute_numbers_match_the_uapi_header() -> None:
    # include/uapi/rdma/rdma_netlink.h, enum rdma_nldev_attr (counted by hand)
    assert (rcodec.ATTR_DEV_INDEX, rcodec.ATTR_DEV_NAME, rcodec.ATTR_PORT_INDEX) == (1, 2, 3)
    assert (rcodec.ATTR_RES_QP, rcodec.ATTR_RES_QP_ENTRY, rcodec.ATTR_RES_LQPN) == (19, 20, 21)
    assert (rcodec.ATTR_RES_PID, rcodec.ATTR_RES_KERN_NAME) == (28, 29)
    assert (rcodec.ATTR_RES_CQ, rcodec.ATTR_RES_CQ_ENTRY) == (35, 36)
    assert (rcodec.ATTR_RES_PD, rcodec.ATTR_RES_PD_ENTRY) == (46, 47)
    assert (rcodec.ATTR_NDEV_INDEX, rcodec.ATTR_NDEV_NAME) == (50, 51)
    assert rcodec.ATTR_LINK_TYPE == 65
    assert rcodec.ATTR_CHARDEV_TYPE == 69
    assert rcodec.ATTR_UVERBS_DRIVER_ID == 73
    assert rcodec.DRIVER_NAMES[14] == "rxe"


def test_newlink_bytes_are_exactly_what_the_kernel_expects() -> None:
    data = rcodec.encode(rcodec.newlink_attrs("rxe0", "rxe", "eth0"))
    # no family header: attributes follow nlmsghdr directly
    assert data == nla(2, b"rxe0\0") + nla(65, b"rxe\0") + nla(51, b"eth0\0")


def test_dellink_carries_the_device_index() -> None:
    assert rcodec.encode([(rcodec.ATTR_DEV_INDEX, 7)]) == nla(1, u32(7))


def canned_dump() -> bytes:
    """A GET dump reply for two devices, as the kernel sends it (plus attrs we ignore)."""
    multi = 0x2
    dev0 = (
        nla(1, u32(0))
        + nla(2, b"mlx5_0\0")
        + nla(3, u32(1))
        + nla(4, struct.pack("=Q", 0x1234))  # CAP_FLAGS (not read)
        + nla(67, b"roce\0")
    )
    dev1 = nla(1, u32(3)) + nla(2, b"rxe0\0") + nla(3, u32(1))
    return (
        message(0x1401, multi, 42, dev0)
        + message(0x1401, multi, 42, dev1)
        + message(3, multi, 42, struct.pack("=i", 0))
    )


def test_parse_canned_dump_reply() -> None:
    msgs = split_messages(canned_dump())
    assert [m.type for m in msgs] == [0x1401, 0x1401, 3]
    devices = [rcodec.NldevAttrs.of(m) for m in msgs[:2]]
    assert [(d.uint(1), d.text(2)) for d in devices] == [(0, "mlx5_0"), (3, "rxe0")]
    assert devices[0].text(rcodec.ATTR_DEV_PROTOCOL) == "roce"
    assert devices[0].uint(4) == 0x1234


def test_parse_port_reply_with_netdev() -> None:
    body = nla(1, u32(3)) + nla(2, b"rxe0\0") + nla(3, u32(1)) + nla(12, b"\x04")
    body += nla(50, u32(9)) + nla(51, b"enp1s0\0")
    [msg] = split_messages(message(0x1405, 0, 5, body))
    port = rcodec.NldevAttrs.of(msg)
    assert port.uint(rcodec.ATTR_NDEV_INDEX) == 9
    assert port.text(rcodec.ATTR_NDEV_NAME) == "enp1s0"
    assert port.uint(rcodec.ATTR_PORT_STATE) == 4


def test_chardev_reply_names_the_driver() -> None:
    body = nla(69, b"uverbs\0") + nla(70, b"uverbs0\0") + nla(73, u32(14))
    [msg] = split_messages(message(0x140F, 0, 6, body))
    driver_id = rcodec.NldevAttrs.of(msg).uint(rcodec.ATTR_UVERBS_DRIVER_ID)
    assert driver_id is not None and rcodec.DRIVER_NAMES[driver_id] == "rxe"


def qp_entry(lqpn: int, *, pid: int | None = None, kern: str | None = None) -> bytes:
    owner = nla(28, u32(pid)) if pid is not None else nla(29, kern.encode() + b"\0")  # type: ignore[union-attr]
    return nla(20, nla(3, u32(1)) + nla(21, u32(lqpn)) + nla(26, b"\x02") + owner)


def test_res_qp_dump_names_owners() -> None:
    table = nla(19, qp_entry(1, kern="ib_core") + qp_entry(17, pid=4242))
    [msg] = split_messages(message(0x140A, 2, 8, nla(1, u32(3)) + nla(2, b"rxe0\0") + table))
    objs = rcodec.decode_res("qp", msg)
    assert [(o.dev_name, o.qpn, o.pid, o.kern_name) for o in objs] == [
        ("rxe0", 1, None, "ib_core"),
        ("rxe0", 17, 4242, None),
    ]


def test_usage_excludes_ib_core_baseline_and_names_holders() -> None:
    def obj(kind: rcodec.ResKind, dev: str, pid: int | None, kern: str | None) -> rcodec.ResObject:
        return rcodec.ResObject(kind, 0, dev, pid, kern)

    objects = [
        obj("qp", "rxe0", None, "ib_core"),
        obj("cq", "rxe0", None, "ib_core"),
        obj("pd", "rxe0", None, "ib_core"),
        obj("qp", "rxe1", None, "ib_core"),
        obj("qp", "rxe1", 123, None),
        obj("cq", "rxe1", 123, None),
        obj("pd", "rxe1", 123, None),
        obj("qp", "rxe1", None, "rpcrdma"),
        obj("qp", "rxe1", None, "rpcrdma"),
    ]
    busy = device_usage(objects, lambda pid: "ibv_rc_pingpong" if pid == 123 else None)
    assert usage_of("rxe0", busy, None) == FREE
    rxe1 = usage_of("rxe1", busy, None)
    assert rxe1.state is Use.IN_USE
    assert rxe1.holders == (
        "kernel user rpcrdma: 2 QPs",
        "pid 123 (ibv_rc_pingpong): 1 QP, 1 CQ, 1 PD",
    )
    failed = usage_of("rxe2", busy, "list RDMA qps on device 2: ...")
    assert failed.state is Use.UNKNOWN and "could not be read" in failed.holders[0]


def test_error_with_extack_text_is_parsed() -> None:
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


def _modules_dir(root: Path) -> Path:
    path = root / "lib/modules" / os.uname().release
    path.mkdir(parents=True)
    return path


@pytest.mark.parametrize(
    ("dep", "builtin", "expected"),
    [
        (None, None, True),  # cannot tell: rxe stays possible, add_link gets the answer
        ("kernel/drivers/infiniband/core/ib_core.ko.xz: kernel/net/core/x.ko\n", "", True),
        ("kernel/drivers/net/veth.ko:\n", "kernel/drivers/infiniband/core/ib_core.ko\n", True),
        ("kernel/drivers/net/veth.ko:\n", "kernel/fs/ext4/ext4.ko\n", False),
    ],
)
async def test_without_ib_core_loaded_nothing_opens_a_socket(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    dep: str | None,
    builtin: str | None,
    expected: bool,
) -> None:
    if dep is not None:
        mods = _modules_dir(tmp_path)
        (mods / "modules.dep").write_text(dep)
        (mods / "modules.builtin").write_text(builtin or "")
    opened: list[int] = []
    real = socket.socket

    def spy(*args: object, **kwargs: object) -> socket.socket:
        opened.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "socket", spy)
    client = rdma.RdmaNetlink(root=tmp_path)  # no sys/module/ib_core in this tree
    assert client.available() is expected
    assert client.reason == (None if expected else rdma.NO_IB_CORE)
    assert await client.devices() == []
    assert await client.links() == []
    assert opened == []


@pytest.mark.parametrize(
    ("err", "reason"),
    [
        (errno.EPROTONOSUPPORT, "the kernel has no RDMA netlink (NETLINK_RDMA)"),
        (errno.EACCES, "cannot open an RDMA netlink socket: Permission denied"),
    ],
)
def test_with_ib_core_a_socket_the_kernel_refuses_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int, reason: str
) -> None:
    """The kernel's refusal, given here by the socket call (a real NETLINK_RDMA socket on
    a host whose kernel ships ib_core would make it load ib_core there). The real
    kernel's EPROTONOSUPPORT: tests/lab/test_lab_rdma.py::test_observing_never_loads_ib_core.
    """
    (tmp_path / "sys/module/ib_core").mkdir(parents=True)
    asked: list[tuple[object, ...]] = []

    def refused(*args: object, **kwargs: object) -> socket.socket:
        asked.append(args)
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(socket, "socket", refused)
    client = rdma.RdmaNetlink(root=tmp_path)
    assert client.available() is False
    assert client.reason == reason
    assert [(a[0], a[2]) for a in asked] == [(socket.AF_NETLINK, 20)]  # NETLINK_RDMA, once


def test_nlmsg_dataclass_is_plain() -> None:
    assert NlMsg(1, 2, 3, b"x").data == b"x"


def summary_reply(index: int, name: str, qp: int, cq: int, pd: int) -> NlMsg:
    entries = b"".join(
        nla(16, nla(17, kind.encode() + b"\0") + nla(18, struct.pack("=Q", n)))
        for kind, n in (("pd", pd), ("cq", cq), ("qp", qp), ("mr", 0))
    )
    body = nla(1, u32(index)) + nla(2, name.encode() + b"\0") + nla(15, entries)
    return NlMsg(0x1409, 2, 1, body)


def res_reply(kind: str, index: int, owners: list[int | str]) -> NlMsg:
    table, entry = {"qp": (19, 20), "cq": (35, 36), "pd": (46, 47)}[kind]
    entries = b"".join(
        nla(entry, nla(28, u32(o)) if isinstance(o, int) else nla(29, o.encode() + b"\0"))
        for o in owners
    )
    return NlMsg(0x1400, 2, 1, nla(1, u32(index)) + nla(2, b"rxe0\0") + nla(table, entries))


class FakeNldev:
    """Answers nldev requests from a table the test changes between passes."""

    def __init__(self) -> None:
        self.owners: dict[str, list[int | str]] = {k: ["ib_core"] for k in ("qp", "cq", "pd")}
        self.sent: list[int] = []

    async def request(self, mtype: int, flags: int, payload: bytes) -> list[NlMsg]:
        op = mtype & 0x3FF
        self.sent.append(op)
        if op == rcodec.CMD_GET:
            return [NlMsg(0x1401, 2, 1, nla(1, u32(1)) + nla(2, b"rxe0\0"))]
        if op == rcodec.CMD_RES_GET:
            n = {k: len(v) for k, v in self.owners.items()}
            return [summary_reply(1, "rxe0", n["qp"], n["cq"], n["pd"])]
        kind = {rcodec.CMD_RES_QP_GET: "qp", rcodec.CMD_RES_CQ_GET: "cq"}.get(op, "pd")
        if op in (rcodec.CMD_RES_QP_GET, rcodec.CMD_RES_CQ_GET, rcodec.CMD_RES_PD_GET):
            return [res_reply(kind, 1, self.owners[kind])]
        return []  # PORT_GET: no netdev

    def close(self) -> None:
        pass


async def test_resource_dumps_run_only_when_counts_change(tmp_path: Path) -> None:
    (tmp_path / "sys/module/ib_core").mkdir(parents=True)
    (tmp_path / "proc/123").mkdir(parents=True)
    (tmp_path / "proc/123/comm").write_text("ibv_rc_pingpong\n")
    client = rdma.RdmaNetlink(root=tmp_path)
    fake = FakeNldev()
    client._nl = fake  # type: ignore[assignment]
    res_dumps = {rcodec.CMD_RES_QP_GET, rcodec.CMD_RES_CQ_GET, rcodec.CMD_RES_PD_GET}

    def dumps() -> int:
        n = sum(1 for op in fake.sent if op in res_dumps)
        fake.sent.clear()
        return n

    [link] = await client.links()
    assert (link.usage, dumps()) == (FREE, 3)
    [link] = await client.links()
    assert (link.usage, dumps()) == (FREE, 0)  # same counts: nothing listed again

    fake.owners["qp"].append(123)
    fake.owners["cq"].append(123)
    [link] = await client.links()
    assert dumps() == 3
    assert link.usage.state is Use.IN_USE
    assert link.usage.holders == ("pid 123 (ibv_rc_pingpong): 1 QP, 1 CQ",)
    [link] = await client.links()
    assert dumps() == 0 and link.usage.state is Use.IN_USE

    (tmp_path / "proc/123/comm").unlink()
    (tmp_path / "proc/123").rmdir()  # the holder is gone, the counts happen to be equal
    fake.owners["qp"][-1] = fake.owners["cq"][-1] = "rpcrdma"
    [link] = await client.links()
    assert dumps() == 3
    assert link.usage.holders == ("kernel user rpcrdma: 1 QP, 1 CQ",)


def test_netns_mode_is_a_u8_named_as_rdma_system_names_it() -> None:
    """`rdma system set netns exclusive|shared`: attribute 66, a u8 (0 exclusive)."""
    assert rcodec.encode_netns_mode("exclusive") == nla(66, b"\x00")
    assert rcodec.encode_netns_mode("shared") == nla(66, b"\x01")
    with pytest.raises(ValueError):
        rcodec.encode_netns_mode("private")
    assert rcodec.nldev_type(rcodec.CMD_SYS_SET) == (5 << 10) + 7
    got = NlMsg(rcodec.nldev_type(rcodec.CMD_SYS_GET), 0, 1, nla(66, b"\x01") + nla(1, b"\0" * 4))
    assert rcodec.decode_netns_mode(got) == "shared"
    assert rcodec.decode_netns_mode(NlMsg(0, 0, 1, nla(67, b"\x01"))) is None
