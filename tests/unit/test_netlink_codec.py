"""rdmad's own rtnetlink codec (rtnl_codec, rtnl_vf_attrs, vf_apply encoding), checked
against pyroute2's decoder as an independent reference."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from rdmad.kernel.netlink import rtnl_codec as rc
from rdmad.kernel.netlink import rtnl_vf_attrs as va
from rdmad.kernel.netlink import vf_apply
from rdmad.kernel.netlink.nlcodec import attr, iter_attrs
from rdmad.model import VfChange, VfSettings


def pyroute2_decode(mtype: int, payload: bytes) -> ifinfmsg:
    data = struct.pack("=IHHII", 16 + len(payload), mtype, 5, 1, 0) + payload
    msg = ifinfmsg(data)
    msg.decode()
    return msg


def test_ifla_numbers_agree_with_pyroute2() -> None:
    names = [entry[0] for entry in ifinfmsg.nla_map]
    for number, name in [
        (rc.IFLA_ADDRESS, "IFLA_ADDRESS"),
        (rc.IFLA_IFNAME, "IFLA_IFNAME"),
        (rc.IFLA_OPERSTATE, "IFLA_OPERSTATE"),
        (rc.IFLA_LINKINFO, "IFLA_LINKINFO"),
        (rc.IFLA_NUM_VF, "IFLA_NUM_VF"),
        (rc.IFLA_VFINFO_LIST, "IFLA_VFINFO_LIST"),
        (rc.IFLA_EXT_MASK, "IFLA_EXT_MASK"),
        (rc.IFLA_PERM_ADDRESS, "IFLA_PERM_ADDRESS"),
    ]:
        assert names[number] == name
    vf_names = [entry[0] for entry in ifinfmsg.vflist.vfinfo.nla_map]
    for which in va.VfAttr:
        assert vf_names[int(which)].startswith("IFLA_VF_")
    for number, name in [
        (va.IFLA_VF_MAC, "IFLA_VF_MAC"),
        (va.IFLA_VF_VLAN, "IFLA_VF_VLAN"),
        (va.IFLA_VF_SPOOFCHK, "IFLA_VF_SPOOFCHK"),
        (va.IFLA_VF_LINK_STATE, "IFLA_VF_LINK_STATE"),
        (va.IFLA_VF_RATE, "IFLA_VF_RATE"),
        (va.IFLA_VF_RSS_QUERY_EN, "IFLA_VF_RSS_QUERY_EN"),
        (va.IFLA_VF_TRUST, "IFLA_VF_TRUST"),
        (va.IFLA_VF_VLAN_LIST, "IFLA_VF_VLAN_LIST"),
    ]:
        assert vf_names[number] == name


def test_every_attribute_has_a_name_for_messages() -> None:
    assert set(va.VF_ATTR_NAMES) == set(va.VfAttr)
    assert [a.label for a in va.ORDER] == [
        "mac", "vlan", "rate", "spoofchk", "link_state", "query_rss", "trust"
    ]  # fmt: skip


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


def test_batch_carries_one_vf_info_per_vf_in_kernel_order() -> None:
    pieces, rejected = vf_apply.plan_pieces(ALL, {})
    assert rejected == []
    msg = pyroute2_decode(rc.RTM_SETLINK, vf_apply.encode_pieces("enp1s0", pieces))
    assert msg.get_attr("IFLA_IFNAME") == "enp1s0"
    assert msg["index"] == 0
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
    vinfo = vf2.get_attr("IFLA_VF_VLAN_LIST").get_attr("IFLA_VF_VLAN_INFO")
    assert (vinfo["vf"], vinfo["vlan"], vinfo["qos"], vinfo["proto"]) == (2, 100, 3, 0x88A8)
    rate = vf2.get_attr("IFLA_VF_RATE")
    assert (rate["vf"], rate["min_tx_rate"], rate["max_tx_rate"]) == (2, 10, 1000)
    assert vf2.get_attr("IFLA_VF_SPOOFCHK")["spoofchk"] == 0
    assert vf2.get_attr("IFLA_VF_LINK_STATE")["link_state"] == 2
    assert vf2.get_attr("IFLA_VF_RSS_QUERY_EN")["rss_query_en"] == 1
    assert vf2.get_attr("IFLA_VF_TRUST")["trust"] == 1


def test_pf_is_addressed_by_ifindex() -> None:
    pieces, _ = vf_apply.plan_pieces([VfChange(0, "trust", None, True)], {})
    msg = pyroute2_decode(rc.RTM_SETLINK, vf_apply.encode_pieces(42, pieces))
    assert msg["index"] == 42
    assert msg.get_attr("IFLA_IFNAME") is None


def test_vlan_info_is_sized_like_the_kernel_struct() -> None:
    pieces, _ = vf_apply.plan_pieces([VfChange(1, "vlan_proto", None, "802.1ad")], {})
    payload = vf_apply.encode_pieces(4, pieces)
    # struct ifla_vf_vlan_info is 16 bytes: the kernel rejects shorter ones with EINVAL.
    marker = struct.pack("=HH", 4 + 16, va.IFLA_VF_VLAN_INFO)
    at = payload.index(marker)
    vf, vlan, qos = struct.unpack_from("=III", payload, at + 4)
    (proto,) = struct.unpack_from("!H", payload, at + 16)
    assert (vf, vlan, qos, proto) == (1, 0, 0, va.ETH_P_8021AD)


def test_missing_vlan_fields_and_rates_come_from_current() -> None:
    current = {1: VfSettings(vlan=5, qos=2, vlan_proto="802.1ad", min_tx_rate=50, max_tx_rate=0)}
    changes = [VfChange(1, "qos", 2, 4), VfChange(1, "max_tx_rate", 0, 900)]
    pieces, _ = vf_apply.plan_pieces(changes, current)
    assert [p.text for p in pieces] == ["vlan 5 qos 4 proto 802.1ad", "rate 50-900"]


def test_vlan_without_proto_on_a_vf_whose_proto_reads_unknown_is_8021q() -> None:
    # netdevsim's fresh VFs report protocol 0: it must not turn into 802.1ad.
    current = {0: VfSettings(vlan=0, qos=0, vlan_proto="0x0000")}
    pieces, _ = vf_apply.plan_pieces([VfChange(0, "vlan", 0, 100)], current)
    assert [p.text for p in pieces] == ["vlan 100 qos 0 proto 802.1Q"]
    msg = pyroute2_decode(rc.RTM_SETLINK, vf_apply.encode_pieces(3, pieces))
    [info] = msg.get_attr("IFLA_VFINFO_LIST").get_attrs("IFLA_VF_INFO")
    assert [a[0] for a in info["attrs"]] == ["IFLA_VF_VLAN"]  # the 802.1Q attribute


def test_vlan_without_proto_and_nothing_read_is_8021q() -> None:
    pieces, _ = vf_apply.plan_pieces([VfChange(0, "vlan", None, 10)], {})
    assert pieces[0].text == "vlan 10 qos 0 proto 802.1Q"
    [(_, vfinfo_list)] = iter_attrs(vf_apply.encode_pieces(1, pieces), rc.IFINFO.size)
    [(_, vfinfo)] = iter_attrs(vfinfo_list)
    assert [t for t, _ in iter_attrs(vfinfo)] == [va.IFLA_VF_VLAN]


def test_invalid_changes_are_rejected_before_sending() -> None:
    pieces, rejected = vf_apply.plan_pieces(
        [
            VfChange(0, "vlan", None, 5000),
            VfChange(0, "colour", None, "red"),
            VfChange(0, "mac", None, "zz:00:00:00:00:01"),
        ],
        {},
    )
    assert pieces == []
    assert [str(r.error) for r in rejected] == [
        "set vf 0 vlan: cannot set vlan to 5000",
        "set vf 0 colour: unknown VF attribute 'colour'",
        "set vf 0 mac: cannot set mac to 'zz:00:00:00:00:01'",
    ]


def test_vf_index_comes_from_ifla_vf_mac_not_the_first_u32() -> None:
    vf = 3
    mac = bytes.fromhex("020000000003") + b"\0" * 26
    info = (
        attr(va.IFLA_VF_MAC, struct.pack("=I", vf) + mac)
        # IFLA_VF_BROADCAST (32 bytes of ff) follows MAC in the kernel's reply
        + attr(13, b"\xff" * 32)
        + attr(va.IFLA_VF_VLAN, struct.pack("=III", vf, 100, 2))
        + attr(
            va.IFLA_VF_VLAN_LIST,
            attr(va.IFLA_VF_VLAN_INFO, struct.pack("=III", vf, 100, 2) + b"\x88\xa8\0\0"),
        )
        + attr(va.IFLA_VF_RATE, struct.pack("=III", vf, 0, 500))
        + attr(va.IFLA_VF_SPOOFCHK, struct.pack("=II", vf, 1))
        + attr(va.IFLA_VF_LINK_STATE, struct.pack("=II", vf, 0))
        + attr(va.IFLA_VF_RSS_QUERY_EN, struct.pack("=II", vf, 0xFFFFFFFF))
        + attr(16, attr(0, struct.pack("=Q", 12345)))  # IFLA_VF_STATS (nested, no index)
        + attr(va.IFLA_VF_TRUST, struct.pack("=II", vf, 0))
    )
    index, settings = va.decode_vf_info(info)
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


def test_vf_info_without_mac_has_no_index() -> None:
    info = attr(va.IFLA_VF_TRUST, struct.pack("=II", 5, 1))
    assert va.decode_vf_info(info)[0] is None


def test_unknown_vlan_protocol_reads_as_its_number() -> None:
    vf = 0
    info = attr(va.IFLA_VF_MAC, struct.pack("=I", vf) + b"\0" * 32) + attr(
        va.IFLA_VF_VLAN_LIST,
        attr(va.IFLA_VF_VLAN_INFO, struct.pack("=III", vf, 0, 0) + b"\0\0\0\0"),
    )
    assert va.decode_vf_info(info)[1].vlan_proto == "0x0000"


def _vf_info_entry(i: int) -> bytes:
    return attr(
        va.IFLA_VF_INFO,
        attr(va.IFLA_VF_MAC, struct.pack("=I", i) + b"\0" * 32)
        + attr(va.IFLA_VF_TRUST, struct.pack("=II", i, 1)),
    )


def test_parse_link_counts_a_truncated_vf_list() -> None:
    ifi = struct.pack("=BxHiII", 0, 1, 7, 1, 0)
    vflist = b"".join(_vf_info_entry(i) for i in range(3))
    data = (
        ifi
        + attr(rc.IFLA_IFNAME, b"enp1s0\0")
        + attr(rc.IFLA_ADDRESS, bytes.fromhex("525400123456"))
        + attr(rc.IFLA_NUM_VF, struct.pack("=I", 8))
        + attr(rc.IFLA_VFINFO_LIST, vflist)
        + attr(rc.IFLA_PARENT_DEV_NAME, b"0000:01:00.0\0")
        + attr(rc.IFLA_PARENT_DEV_BUS_NAME, b"pci\0")
    )
    link = rc.parse_link(data)
    assert (link.name, link.ifindex, link.mac, link.up) == ("enp1s0", 7, "52:54:00:12:34:56", True)
    assert link.num_vf == 8 and sorted(link.vfs) == [0, 1, 2]
    assert not link.vfs_complete
    assert link.pci == "0000:01:00.0"


def test_parse_link_agrees_with_pyroute2_on_a_pyroute2_encoded_link() -> None:
    msg = ifinfmsg()
    msg["index"] = 9
    msg["flags"] = 1
    msg["attrs"] = [
        ("IFLA_IFNAME", "veth7"),
        ("IFLA_ADDRESS", "02:11:22:33:44:55"),
        ("IFLA_OPERSTATE", "UP"),
        ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "veth")]}),
    ]
    msg.encode()
    link = rc.parse_link(bytes(msg.data[16:]))
    ref = pyroute2_decode(rc.RTM_NEWLINK, bytes(msg.data[16:]))
    assert link.name == ref.get_attr("IFLA_IFNAME") == "veth7"
    assert link.mac == ref.get_attr("IFLA_ADDRESS")
    assert link.ifindex == ref["index"] == 9
    assert (link.up, link.operstate, link.kind) == (True, "up", "veth")


def test_requests_decode_in_pyroute2() -> None:
    dump = pyroute2_decode(rc.RTM_GETLINK, rc.encode_getlink_dump())
    assert dump.get_attr("IFLA_EXT_MASK") == rc.RTEXT_FILTER_VF | rc.RTEXT_FILTER_SKIP_STATS
    one = pyroute2_decode(rc.RTM_GETLINK, rc.encode_getlink(12))
    assert one["index"] == 12
    up = pyroute2_decode(rc.RTM_SETLINK, rc.encode_set_up("eth0"))
    assert (up["flags"], up["change"], up.get_attr("IFLA_IFNAME")) == (1, 1, "eth0")


_mac = st.lists(st.integers(0, 255), min_size=6, max_size=6).map(
    lambda b: ":".join(f"{x:02x}" for x in [b[0] & 0xFE, *b[1:]])
)
_u32 = st.integers(0, 0xFFFFFFFF)


@given(
    vf=st.integers(0, 4095),
    mac=_mac,
    vlan=st.integers(0, 4095),
    qos=st.integers(0, 7),
    proto=st.sampled_from(["802.1Q", "802.1ad"]),
    rates=st.tuples(_u32, _u32),
    flags=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    state=st.sampled_from(va.LINK_STATES),
)
def test_vf_record_round_trips_and_pyroute2_agrees(
    vf: int,
    mac: str,
    vlan: int,
    qos: int,
    proto: str,
    rates: tuple[int, int],
    flags: tuple[bool, bool, bool],
    state: str,
) -> None:
    record = va.VfRecord(
        vf,
        mac=mac,
        vlan=va.VfVlan(vlan, qos, proto),
        rate=va.VfRate(*rates),
        spoofchk=flags[0],
        link_state=state,
        query_rss=flags[1],
        trust=flags[2],
    )
    encoded = va.encode_vf_info(record)
    [(atype, payload)] = iter_attrs(encoded)
    assert atype == va.IFLA_VF_INFO
    index, got = va.decode_vf_info(payload)
    assert index == vf
    assert got == VfSettings(
        mac=mac,
        vlan=vlan,
        qos=qos,
        vlan_proto=proto,
        spoofchk=flags[0],
        trust=flags[2],
        link_state=state,
        min_tx_rate=rates[0],
        max_tx_rate=rates[1],
        query_rss=flags[1],
    )
    ref = pyroute2_decode(rc.RTM_SETLINK, rc.encode_setlink_vfs(1, [encoded]))
    [info] = ref.get_attr("IFLA_VFINFO_LIST").get_attrs("IFLA_VF_INFO")
    assert info.get_attr("IFLA_VF_MAC")["mac"] == mac
    assert info.get_attr("IFLA_VF_RATE")["max_tx_rate"] == rates[1]
    assert info.get_attr("IFLA_VF_TRUST")["trust"] == int(flags[2])


def test_large_vf_sets_are_split_below_the_u16_attribute_limit() -> None:
    changes = [
        VfChange(vf, name, None, value)
        for vf in range(600)
        for name, value in [
            ("mac", "02:00:00:00:11:22"),
            ("vlan_proto", "802.1ad"),
            ("spoofchk", True),
            ("trust", True),
            ("link_state", "auto"),
            ("max_tx_rate", 100),
            ("query_rss", False),
        ]
    ]
    pieces, _ = vf_apply.plan_pieces(changes, {})
    batches = vf_apply.split_batches(pieces)
    assert len(batches) > 1
    assert sum(len(b) for b in batches) == len(pieces)
    for batch in batches:
        payload = vf_apply.encode_pieces(3, batch)
        assert len(payload) < 65535
    vfs_per_batch = [sorted({p.vf for p in b}) for b in batches]
    flat = [vf for vfs in vfs_per_batch for vf in vfs]
    assert flat == list(range(600))  # no VF split across batches, order kept


@given(
    names=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=15),
    before=st.lists(st.tuples(st.integers(4, 60), st.binary(max_size=12)), max_size=6),
)
def test_link_name_reads_what_the_full_parse_reads(
    names: str, before: list[tuple[int, bytes]]
) -> None:
    """The event reader's one-attribute walk finds the name wherever it is."""
    header = rc.IFINFO.pack(0, 0, 7, 0, 0xFFFFFFFF)
    others = b"".join(attr(t, v) for t, v in before if t != rc.IFLA_IFNAME)
    data = header + others + attr(rc.IFLA_IFNAME, names.encode() + b"\0") + attr(4, b"x")
    assert rc.link_name(data) == rc.parse_ifinfo(data).name == names
    assert rc.link_name(header + others) is None
    assert rc.link_name(data[: len(header) + len(others) + 3]) is None  # cut inside it
