"""rdmad's devlink codec (kernel/netlink/devlink_codec) against pyroute2's generic
netlink and devlink classes as an independent reference: the numbers, the requests as
pyroute2 decodes them, and pyroute2-encoded replies as rdmad decodes them."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyroute2.netlink import ctrlmsg
from pyroute2.netlink import devlink as pr_devlink
from pyroute2.netlink.devlink import devlinkcmd

from rdmad.kernel.netlink import devlink_codec as dl
from rdmad.kernel.netlink.nlcodec import (
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    attr,
    split_messages,
)

FAMILY_ID = 0x15


def decoded(cls: type, wire: bytes):  # type: ignore[no-untyped-def]
    msg = cls(wire)
    msg.decode()
    return msg


def reply(msg: object) -> dl.NlMsg:
    """A pyroute2-encoded message as rdmad's reader hands it to the codec."""
    msg.encode()  # type: ignore[attr-defined]
    (one,) = split_messages(bytes(msg.data))  # type: ignore[attr-defined]
    return one


def test_numbers_agree_with_pyroute2() -> None:
    for name, value in [
        ("DEVLINK_CMD_GET", dl.CMD_GET),
        ("DEVLINK_CMD_PORT_GET", dl.CMD_PORT_GET),
        ("DEVLINK_CMD_PORT_SET", dl.CMD_PORT_SET),
        ("DEVLINK_CMD_PORT_NEW", dl.CMD_PORT_NEW),
        ("DEVLINK_CMD_PORT_DEL", dl.CMD_PORT_DEL),
        ("DEVLINK_CMD_ESWITCH_GET", dl.CMD_ESWITCH_GET),
        ("DEVLINK_CMD_ESWITCH_SET", dl.CMD_ESWITCH_SET),
    ]:
        assert getattr(pr_devlink, name) == value, name
    names = [entry[0] for entry in devlinkcmd.nla_map]
    for number, name in [
        (dl.ATTR_BUS_NAME, "DEVLINK_ATTR_BUS_NAME"),
        (dl.ATTR_DEV_NAME, "DEVLINK_ATTR_DEV_NAME"),
        (dl.ATTR_PORT_INDEX, "DEVLINK_ATTR_PORT_INDEX"),
        (dl.ATTR_PORT_NETDEV_NAME, "DEVLINK_ATTR_PORT_NETDEV_NAME"),
        (dl.ATTR_ESWITCH_MODE, "DEVLINK_ATTR_ESWITCH_MODE"),
        (dl.ATTR_ESWITCH_INLINE_MODE, "DEVLINK_ATTR_ESWITCH_INLINE_MODE"),
        (dl.ATTR_ESWITCH_ENCAP_MODE, "DEVLINK_ATTR_ESWITCH_ENCAP_MODE"),
        (dl.ATTR_PORT_FLAVOUR, "DEVLINK_ATTR_PORT_FLAVOUR"),
        (dl.ATTR_PORT_PCI_PF_NUMBER, "DEVLINK_ATTR_PORT_PCI_PF_NUMBER"),
        (dl.ATTR_PORT_PCI_VF_NUMBER, "DEVLINK_ATTR_PORT_PCI_VF_NUMBER"),
        (dl.ATTR_PORT_FUNCTION, "DEVLINK_ATTR_PORT_FUNCTION"),
    ]:
        assert names[number] == name
    ctrl = [entry[0] for entry in ctrlmsg.nla_map]
    assert ctrl[dl.CTRL_ATTR_FAMILY_ID] == "CTRL_ATTR_FAMILY_ID"
    assert ctrl[dl.CTRL_ATTR_FAMILY_NAME] == "CTRL_ATTR_FAMILY_NAME"
    assert ctrl[dl.CTRL_ATTR_MCAST_GROUPS] == "CTRL_ATTR_MCAST_GROUPS"


def test_family_request_and_reply() -> None:
    req = decoded(ctrlmsg, dl.family_request(7))
    assert req["header"]["type"] == dl.GENL_ID_CTRL and req["cmd"] == dl.CTRL_CMD_GETFAMILY
    assert req.get_attr("CTRL_ATTR_FAMILY_NAME") == "devlink"
    # The reply as the kernel builds it: the groups an array of nested entries (numbered
    # 1, 2, ...). Built here; pyroute2 decodes it as the reference.
    group = attr(dl.CTRL_ATTR_MCAST_GRP_NAME, b"config\0") + attr(
        dl.CTRL_ATTR_MCAST_GRP_ID, struct.pack("=I", 9)
    )
    payload = (
        struct.pack("=BBH", 1, 2, 0)  # CTRL_CMD_NEWFAMILY
        + attr(dl.CTRL_ATTR_FAMILY_ID, struct.pack("=H", FAMILY_ID))
        + attr(dl.CTRL_ATTR_FAMILY_NAME, b"devlink\0")
        + attr(dl.CTRL_ATTR_MCAST_GROUPS, attr(1, group))
    )
    wire = struct.pack("=IHHII", 16 + len(payload), dl.GENL_ID_CTRL, 0, 7, 0) + payload
    ref = decoded(ctrlmsg, wire)
    assert ref.get_attr("CTRL_ATTR_FAMILY_ID") == FAMILY_ID
    (ref_group,) = ref.get_attr("CTRL_ATTR_MCAST_GROUPS")
    assert ref_group.get_attr("CTRL_ATTR_MCAST_GRP_NAME") == "config"
    (msg,) = split_messages(wire)
    family = dl.parse_family(msg)
    assert family.id == FAMILY_ID
    assert (
        family.mcast_groups
        == {"config": ref_group.get_attr("CTRL_ATTR_MCAST_GRP_ID")}
        == {"config": 9}
    )


@pytest.mark.parametrize(
    ("mode", "inline", "encap"),
    [("switchdev", None, None), ("legacy", None, None), ("switchdev", "transport", "basic")],
)
def test_eswitch_set_decodes_in_pyroute2(mode: str, inline: str | None, encap: str | None) -> None:
    wire = dl.eswitch_set_request(FAMILY_ID, 3, "pci", "0000:3b:00.0", mode, inline, encap)
    msg = decoded(devlinkcmd, wire)
    assert msg["header"]["type"] == FAMILY_ID
    assert msg["header"]["flags"] == NLM_F_REQUEST | NLM_F_ACK
    assert (msg["cmd"], msg["version"]) == (dl.CMD_ESWITCH_SET, dl.VERSION)
    assert msg.get_attr("DEVLINK_ATTR_BUS_NAME") == "pci"
    assert msg.get_attr("DEVLINK_ATTR_DEV_NAME") == "0000:3b:00.0"
    assert msg.get_attr("DEVLINK_ATTR_ESWITCH_MODE") == dl.ESWITCH_MODES.index(mode)
    assert msg.get_attr("DEVLINK_ATTR_ESWITCH_INLINE_MODE") == (
        None if inline is None else dl.INLINE_MODES.index(inline)
    )
    assert msg.get_attr("DEVLINK_ATTR_ESWITCH_ENCAP_MODE") == (
        None if encap is None else dl.ENCAP_MODES.index(encap)
    )


def test_eswitch_set_refuses_a_mode_the_kernel_has_not() -> None:
    with pytest.raises(ValueError):
        dl.eswitch_set_request(FAMILY_ID, 1, "pci", "0000:3b:00.0", mode="offload")


def test_eswitch_reply_from_pyroute2() -> None:
    msg = devlinkcmd()
    msg["cmd"] = dl.CMD_ESWITCH_GET
    msg["version"] = 1
    msg["header"]["type"] = FAMILY_ID
    msg["attrs"] = [
        ("DEVLINK_ATTR_BUS_NAME", "netdevsim"),
        ("DEVLINK_ATTR_DEV_NAME", "netdevsim1"),
        ("DEVLINK_ATTR_ESWITCH_MODE", 1),
        ("DEVLINK_ATTR_ESWITCH_INLINE_MODE", 2),
        ("DEVLINK_ATTR_ESWITCH_ENCAP_MODE", 7),
    ]
    esw = dl.parse_eswitch(reply(msg))
    assert esw == dl.Eswitch("netdevsim", "netdevsim1", "switchdev", "network", "unknown(7)")
    assert dl.genl_cmd(reply(msg)) == dl.CMD_ESWITCH_GET


def test_port_dump_request() -> None:
    everything = decoded(devlinkcmd, dl.port_dump_request(FAMILY_ID, 4))
    assert everything["cmd"] == dl.CMD_PORT_GET
    assert everything["header"]["flags"] == NLM_F_REQUEST | NLM_F_DUMP
    assert everything["attrs"] == []
    one = decoded(devlinkcmd, dl.port_dump_request(FAMILY_ID, 4, "pci", "0000:3b:00.0"))
    assert one.get_attr("DEVLINK_ATTR_DEV_NAME") == "0000:3b:00.0"


def _function(*parts: bytes) -> bytes:
    return b"".join(parts)


def test_vf_representor_port_with_its_function() -> None:
    """A pcivf port as mlx5 and netdevsim report it in switchdev mode. The function's
    attributes are numbered in their own space (pyroute2 decodes them as devlink's
    top-level attributes), so they are built here byte for byte."""
    msg = devlinkcmd()
    msg["cmd"] = dl.CMD_PORT_NEW
    msg["version"] = 1
    msg["header"]["type"] = FAMILY_ID
    msg["attrs"] = [
        ("DEVLINK_ATTR_BUS_NAME", "pci"),
        ("DEVLINK_ATTR_DEV_NAME", "0000:3b:00.0"),
        ("DEVLINK_ATTR_PORT_INDEX", 2),
        ("DEVLINK_ATTR_PORT_NETDEV_NAME", "eth3"),
        ("DEVLINK_ATTR_PORT_FLAVOUR", 4),
        ("DEVLINK_ATTR_PORT_PCI_PF_NUMBER", 0),
        ("DEVLINK_ATTR_PORT_PCI_VF_NUMBER", 1),
    ]
    base = reply(msg)
    function = attr(
        dl.ATTR_PORT_FUNCTION,
        _function(
            attr(dl.PORT_FUNCTION_ATTR_HW_ADDR, bytes.fromhex("02aabbccdd01")),
            attr(dl.PORT_FN_ATTR_STATE, b"\x01"),
            attr(dl.PORT_FN_ATTR_OPSTATE, b"\x01"),
        ),
    )
    port = dl.parse_port(dl.NlMsg(base.type, base.flags, base.seq, base.data + function))
    assert port == dl.Port(
        bus="pci",
        dev="0000:3b:00.0",
        index=2,
        flavour="pcivf",
        pf_number=0,
        vf_number=1,
        netdev="eth3",
        hw_addr="02:aa:bb:cc:dd:01",
        fn_state="active",
        fn_opstate="attached",
    )


def test_port_function_set_request_bytes() -> None:
    wire = dl.port_function_set_request(FAMILY_ID, 5, "pci", "0000:3b:00.0", 2, "02:AA:bb:cc:dd:01")
    msg = decoded(devlinkcmd, wire)
    assert msg["cmd"] == dl.CMD_PORT_SET
    assert msg["header"]["flags"] == NLM_F_REQUEST | NLM_F_ACK
    assert msg.get_attr("DEVLINK_ATTR_PORT_INDEX") == 2
    # The nested function: one HW_ADDR attribute, 4 + 6 bytes, padded to 12.
    tail = wire[-16:]
    assert struct.unpack_from("=HH", tail, 0) == (16, dl.ATTR_PORT_FUNCTION)
    assert struct.unpack_from("=HH", tail, 4) == (10, dl.PORT_FUNCTION_ATTR_HW_ADDR)
    assert tail[8:14] == bytes.fromhex("02aabbccdd01") and tail[14:] == b"\0\0"


@given(
    mode=st.sampled_from(dl.ESWITCH_MODES),
    inline=st.none() | st.sampled_from(dl.INLINE_MODES),
    encap=st.none() | st.sampled_from(dl.ENCAP_MODES),
    dev=st.from_regex(r"0000:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]", fullmatch=True),
)
def test_eswitch_request_reads_back_as_what_was_set(
    mode: str, inline: str | None, encap: str | None, dev: str
) -> None:
    """The kernel's GET reply carries the same attributes as the SET request."""
    (msg,) = split_messages(dl.eswitch_set_request(FAMILY_ID, 1, "pci", dev, mode, inline, encap))
    assert dl.parse_eswitch(msg) == dl.Eswitch("pci", dev, mode, inline, encap)


def test_device_dump_request_and_reply() -> None:
    req = decoded(devlinkcmd, dl.device_dump_request(FAMILY_ID, 3))
    assert req["cmd"] == dl.CMD_GET
    assert req["header"]["flags"] == NLM_F_REQUEST | NLM_F_DUMP
    msg = devlinkcmd()
    msg["header"]["type"] = FAMILY_ID
    msg["cmd"] = dl.CMD_NEW
    msg["version"] = 1
    msg["attrs"] = [
        ("DEVLINK_ATTR_BUS_NAME", "netdevsim"),
        ("DEVLINK_ATTR_DEV_NAME", "netdevsim41"),
    ]
    assert dl.parse_device(reply(msg)) == ("netdevsim", "netdevsim41")
