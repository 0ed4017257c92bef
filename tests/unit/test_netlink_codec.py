"""rtnetlink encoding/decoding in rdmad.kernel.netlink, cross-checked against pyroute2."""

from __future__ import annotations

import struct

from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from rdmad.kernel import netlink as nl
from rdmad.model import VfChange, VfSettings


def test_ifla_numbers_agree_with_pyroute2() -> None:
    names = [entry[0] for entry in ifinfmsg.nla_map]
    for number, name in [
        (nl.IFLA_ADDRESS, "IFLA_ADDRESS"),
        (nl.IFLA_IFNAME, "IFLA_IFNAME"),
        (nl.IFLA_OPERSTATE, "IFLA_OPERSTATE"),
        (nl.IFLA_LINKINFO, "IFLA_LINKINFO"),
        (nl.IFLA_NUM_VF, "IFLA_NUM_VF"),
        (nl.IFLA_VFINFO_LIST, "IFLA_VFINFO_LIST"),
        (nl.IFLA_EXT_MASK, "IFLA_EXT_MASK"),
        (nl.IFLA_PERM_ADDRESS, "IFLA_PERM_ADDRESS"),
    ]:
        assert names[number] == name
    vf_names = [entry[0] for entry in ifinfmsg.vflist.vfinfo.nla_map]
    for number, name in [
        (nl.IFLA_VF_MAC, "IFLA_VF_MAC"),
        (nl.IFLA_VF_VLAN, "IFLA_VF_VLAN"),
        (nl.IFLA_VF_SPOOFCHK, "IFLA_VF_SPOOFCHK"),
        (nl.IFLA_VF_LINK_STATE, "IFLA_VF_LINK_STATE"),
        (nl.IFLA_VF_RATE, "IFLA_VF_RATE"),
        (nl.IFLA_VF_RSS_QUERY_EN, "IFLA_VF_RSS_QUERY_EN"),
        (nl.IFLA_VF_TRUST, "IFLA_VF_TRUST"),
        (nl.IFLA_VF_VLAN_LIST, "IFLA_VF_VLAN_LIST"),
    ]:
        assert vf_names[number] == name


ALL = [
    VfChange(2, "mac", None, "02:00:00:00:00:02"),
    VfChange(2, "vlan", None, 100),
    VfChange(2, "qos", None, 3),
    VfChange(2, "vlan_proto", None, "802.1ad"),
    VfChange(2, "spoofchk", None, False),
    VfChange(2, "trust", None, True),
    VfChange(2, "link_state", None, "disable"),
    VfChange(2, "min_tx_rate", None, 10),
    VfChange(2, "max_tx_rate", None, 1000),
    VfChange(2, "query_rss", None, True),
    VfChange(0, "vlan", None, 7),
]


def decode_setlink(payload: bytes) -> ifinfmsg:
    data = struct.pack("=IHHII", 16 + len(payload), nl.RTM_SETLINK, 5, 1, 0) + payload
    msg = ifinfmsg(data)
    msg.decode()
    return msg


def test_batch_carries_one_vf_info_per_vf_in_order() -> None:
    pieces, rejected = nl.plan_pieces(ALL, {})
    assert rejected == []
    msg = decode_setlink(nl.encode_setlink("enp1s0", pieces))
    assert msg.get_attr("IFLA_IFNAME") == "enp1s0"
    infos = msg.get_attr("IFLA_VFINFO_LIST").get_attrs("IFLA_VF_INFO")
    assert len(infos) == 2
    vf0, vf2 = infos
    assert vf0.get_attr("IFLA_VF_VLAN")["vlan"] == 7
    assert [a[0] for a in vf2["attrs"]] == [
        "IFLA_VF_MAC",
        "IFLA_VF_VLAN_LIST",
        "IFLA_VF_RATE",
        "IFLA_VF_SPOOFCHK",
        "IFLA_VF_LINK_STATE",
        "IFLA_VF_RSS_QUERY_EN",
        "IFLA_VF_TRUST",
    ]
    assert vf2.get_attr("IFLA_VF_MAC")["mac"] == "02:00:00:00:00:02"
    rate = vf2.get_attr("IFLA_VF_RATE")
    assert (rate["min_tx_rate"], rate["max_tx_rate"]) == (10, 1000)
    assert vf2.get_attr("IFLA_VF_LINK_STATE")["link_state"] == 2


def test_vlan_info_is_sized_like_the_kernel_struct() -> None:
    pieces, _ = nl.plan_pieces([VfChange(1, "vlan_proto", None, "802.1ad")], {})
    payload = nl.encode_setlink(4, pieces)
    # struct ifla_vf_vlan_info is 16 bytes: the kernel rejects shorter ones with EINVAL.
    marker = struct.pack("=HH", 4 + 16, nl.IFLA_VF_VLAN_INFO)
    at = payload.index(marker)
    vf, vlan, qos = struct.unpack_from("=III", payload, at + 4)
    (proto,) = struct.unpack_from("!H", payload, at + 16)
    assert (vf, vlan, qos, proto) == (1, 0, 0, nl.ETH_P_8021AD)


def test_missing_vlan_fields_and_rates_come_from_current() -> None:
    current = {1: VfSettings(vlan=5, qos=2, vlan_proto="802.1ad", min_tx_rate=50, max_tx_rate=0)}
    changes = [VfChange(1, "qos", 2, 4), VfChange(1, "max_tx_rate", 0, 900)]
    pieces, _ = nl.plan_pieces(changes, current)
    assert [p.text for p in pieces] == ["vlan 5 qos 4 proto 802.1ad", "rate 50-900"]


def test_plain_8021q_uses_the_old_vlan_attribute() -> None:
    pieces, _ = nl.plan_pieces([VfChange(0, "vlan", None, 10)], {})
    assert pieces[0].nla[0] == "IFLA_VF_VLAN"


def test_invalid_changes_are_rejected_before_sending() -> None:
    pieces, rejected = nl.plan_pieces(
        [VfChange(0, "vlan", None, 5000), VfChange(0, "colour", None, "red")], {}
    )
    assert pieces == []
    assert [str(r.error) for r in rejected] == [
        "set vf 0 vlan: cannot set vlan to 5000",
        "set vf 0 colour: unknown VF attribute 'colour'",
    ]


def vf_attr(atype: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), atype) + payload
    return raw + b"\0" * (-len(raw) % 4)


def test_parse_vf_info_as_the_kernel_reports_it() -> None:
    vf = 3
    mac = bytes.fromhex("020000000003") + b"\0" * 26
    info = (
        vf_attr(nl.IFLA_VF_MAC, struct.pack("=I", vf) + mac)
        + vf_attr(nl.IFLA_VF_VLAN, struct.pack("=III", vf, 100, 2))
        + vf_attr(
            nl.IFLA_VF_VLAN_LIST,
            vf_attr(nl.IFLA_VF_VLAN_INFO, struct.pack("=III", vf, 100, 2) + b"\x88\xa8\0\0"),
        )
        + vf_attr(nl.IFLA_VF_RATE, struct.pack("=III", vf, 0, 500))
        + vf_attr(nl.IFLA_VF_SPOOFCHK, struct.pack("=II", vf, 1))
        + vf_attr(nl.IFLA_VF_LINK_STATE, struct.pack("=II", vf, 0))
        + vf_attr(nl.IFLA_VF_RSS_QUERY_EN, struct.pack("=II", vf, 0xFFFFFFFF))
        + vf_attr(nl.IFLA_VF_TRUST, struct.pack("=II", vf, 0))
    )
    index, settings = nl.parse_vf_info(info)
    assert index == 3
    assert settings == VfSettings(
        mac="02:00:00:00:00:03",
        vlan=100,
        qos=2,
        vlan_proto="802.1ad",
        spoofchk=True,
        trust=False,
        link_state="auto",
        min_tx_rate=0,
        max_tx_rate=500,
        query_rss=None,  # -1: the driver does not report it
    )


def test_parse_link_counts_a_truncated_vf_list() -> None:
    ifi = struct.pack("=BxHiII", 0, 1, 7, 1, 0)
    vflist = b"".join(
        vf_attr(nl.IFLA_VF_INFO, vf_attr(nl.IFLA_VF_TRUST, struct.pack("=II", i, 1)))
        for i in range(3)
    )
    data = (
        ifi
        + vf_attr(nl.IFLA_IFNAME, b"enp1s0\0")
        + vf_attr(nl.IFLA_ADDRESS, bytes.fromhex("525400123456"))
        + vf_attr(nl.IFLA_NUM_VF, struct.pack("=I", 8))
        + vf_attr(nl.IFLA_VFINFO_LIST, vflist)
        + vf_attr(nl.IFLA_PARENT_DEV_NAME, b"0000:01:00.0\0")
        + vf_attr(nl.IFLA_PARENT_DEV_BUS_NAME, b"pci\0")
    )
    link = nl.parse_link(data)
    assert (link.name, link.ifindex, link.mac, link.up) == ("enp1s0", 7, "52:54:00:12:34:56", True)
    assert link.num_vf == 8 and sorted(link.vfs) == [0, 1, 2]
    assert not link.vfs_complete
    assert link.pci == "0000:01:00.0"


def test_vlan_fix_survives_prior_use_of_plain_ifinfmsg() -> None:
    # pyroute2 caches compiled tables per class; the subclass must not inherit them.
    plain = ifinfmsg()
    plain["attrs"] = [("IFLA_VFINFO_LIST", {"attrs": []})]
    plain.encode()
    test_vlan_info_is_sized_like_the_kernel_struct()


def test_large_vf_sets_are_split_below_the_u16_attribute_limit() -> None:
    changes = [
        VfChange(vf, attr, None, value)
        for vf in range(600)
        for attr, value in [
            ("mac", "02:00:00:00:11:22"),
            ("vlan_proto", "802.1ad"),
            ("spoofchk", True),
            ("trust", True),
            ("link_state", "auto"),
            ("max_tx_rate", 100),
            ("query_rss", False),
        ]
    ]
    pieces, _ = nl.plan_pieces(changes, {})
    batches = nl.split_batches(pieces)
    assert len(batches) > 1
    assert sum(len(b) for b in batches) == len(pieces)
    for batch in batches:
        payload = nl.encode_setlink(3, batch)
        assert len(payload) < 65535
    vfs_per_batch = [sorted({p.vf for p in b}) for b in batches]
    flat = [vf for vfs in vfs_per_batch for vf in vfs]
    assert flat == list(range(600))  # no VF split across batches, order kept
