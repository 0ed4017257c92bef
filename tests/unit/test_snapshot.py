"""snapshot(): live state in config format; a snapshot plans nothing on its node."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rdmad import config
from rdmad.model import (
    NO_DRIVER,
    BindVfDriver,
    Desired,
    IbVfSettings,
    Observed,
    PfObserved,
    PlanState,
    RdmaLinkObserved,
    RdmaSysObserved,
    SetVfSettings,
    SyncIbCoreOptions,
    VfObserved,
    VfSettings,
)
from rdmad.reconcile import plan
from rdmad.snapshot import snapshot
from rdmad.tomlcompat import tomllib
from tests.support.records import replace
from tests.unit.test_reconcile import node, pf


def parsed(text: str) -> Desired:
    desired, errors = config.parse([("snapshot.toml", tomllib.loads(text))])
    assert desired is not None, errors
    return desired


def round_trip(observed: Observed) -> tuple[str, list[object]]:
    text = snapshot(observed, header="test")
    return text, plan(parsed(text), observed, PlanState())  # type: ignore[return-value]


def test_snapshot_of_a_hand_set_node() -> None:
    p = pf(numvfs=2, ib=True)
    vf0 = replace(
        p.vfs[0],
        driver="vfio-pci",
        settings=VfSettings(
            "02:00:00:00:00:09", 100, 3, "802.1ad", False, True, "disable", 10, 1000, True
        ),
        ib=IbVfSettings("00:11:22:33:44:55:66:77", "00:11:22:33:44:55:66:78", "Up"),
    )
    o = node(
        replace(p, vfs=(vf0, p.vfs[1])),
        rdma=(
            RdmaLinkObserved("rxe0", "rxe", "eth0"),
            RdmaLinkObserved("mlx5_0", "mlx5_core", "ens1f0"),
        ),
    )
    text, actions = round_trip(o)
    assert actions == []
    assert 'pf = { pci = "0000:3b:00.0" }' in text
    assert 'vlan_proto = "802.1ad"' in text and 'driver = "vfio-pci"' in text
    assert 'node_guid = "00:11:22:33:44:55:66:77"' in text
    assert '[[rxe]]\nname = "rxe0"\nnetdev = { name = "eth0" }' in text
    assert "mlx5_0" not in text.split("[[rxe]]")[-1]  # only rxe links are declared


def test_pf_without_vfs_is_not_declared() -> None:
    text = snapshot(node(pf(numvfs=0)))
    assert "[[sriov]]" not in text


SETTINGS = st.builds(
    VfSettings,
    mac=st.sampled_from(["00:00:00:00:00:00", "02:00:00:00:00:01", "52:54:00:aa:bb:cc"]),
    vlan=st.integers(0, 4094),
    qos=st.integers(0, 7),
    vlan_proto=st.sampled_from(["802.1Q", "802.1ad"]),
    spoofchk=st.booleans(),
    trust=st.booleans(),
    link_state=st.sampled_from(["auto", "enable", "disable"]),
    min_tx_rate=st.just(0),
    max_tx_rate=st.integers(0, 100000),
    query_rss=st.booleans(),
)


@settings(max_examples=200)
@given(st.integers(1, 8), st.data())
def test_any_snapshot_plans_nothing(count: int, data: st.DataObject) -> None:
    p = pf(numvfs=count, totalvfs=8)
    vfs = []
    for v in p.vfs:
        s = data.draw(SETTINGS)
        if s.vlan == 0:  # the kernel reports qos 0 / 802.1Q without a VLAN
            s = replace(s, qos=0, vlan_proto="802.1Q")
        vfs.append(replace(v, settings=s))
    _, actions = round_trip(node(replace(p, vfs=tuple(vfs))))
    assert actions == []


# --- hand-built nodes: what a snapshot declares, comments, and leaves out ---------------

FULL = VfSettings("02:00:00:00:00:0a", 100, 3, "802.1ad", False, True, "disable", 10, 1000, True)


def netdevsim_pf() -> PfObserved:
    """netdevsim: VFs are indexes with settings, no PCI devices, every attribute settable."""
    vfs = tuple(
        VfObserved(i, f"netdevsim1/vf{i}", settings=FULL if i == 0 else VfSettings(
            ZERO, 0, 0, "802.1Q", True, False, "auto", 0, 0, False))
        for i in range(3)
    )  # fmt: skip
    return PfObserved("netdevsim1", "netdevsim", "eni1np1", 7, None, None, 3, 8, vfs=vfs)


ZERO = "00:00:00:00:00:00"
# What igb reports for a VF (Linux 6.1): link state auto, rates 0, no RSS query (-1: unset).
IGB_VF = VfSettings("02:00:00:00:01:00", 42, 2, "802.1Q", True, False, "auto", 0, 0, None)


def igb_pf(*vfs: VfObserved, autoprobe: bool = True) -> PfObserved:
    return PfObserved(
        "0000:01:00.0", "igb", "enp1s0", 3, None, None, len(vfs), 7,
        drivers_autoprobe=autoprobe, vfs=vfs,
    )  # fmt: skip


def igb_vf(i: int, driver: str | None = "igbvf", override: str | None = None) -> VfObserved:
    return VfObserved(i, f"0000:01:10.{i}", driver, override, settings=IGB_VF)


def test_netdevsim_pf_declares_every_attribute_and_no_driver() -> None:
    text, actions = round_trip(node(netdevsim_pf()))
    assert actions == []
    assert 'pf = { name = "eni1np1" }  # netdevsim1' in text
    assert "driver" not in text.split("numvfs")[1]  # netdevsim VFs are not PCI devices
    [sriov] = parsed(text).sriov
    vf0 = sriov.vf[0]
    assert (vf0.vlan_proto, vf0.link_state, vf0.min_tx_rate, vf0.query_rss) == (
        "802.1ad", "disable", 10, True,
    )  # fmt: skip


def test_igb_pf_comments_what_igb_cannot_set() -> None:
    text, actions = round_trip(node(igb_pf(igb_vf(0), igb_vf(1))))
    assert actions == []
    assert '# link_state = "auto"  (igb cannot set it)' in text
    assert "# min_tx_rate = 0  (igb has no minimum rate)" in text
    assert "# max_tx_rate = 0  (igb sets it only on an 82576 with link up" in text
    assert "# not reported by the driver (reads as unset), so not declared: query_rss" in text
    [sriov] = parsed(text).sriov
    vf0 = sriov.vf[0]
    assert (vf0.mac, vf0.vlan, vf0.qos, vf0.vlan_proto, vf0.spoofchk, vf0.trust) == (
        "02:00:00:00:01:00", 42, 2, "802.1Q", True, False,
    )  # fmt: skip
    assert (vf0.link_state, vf0.min_tx_rate, vf0.max_tx_rate, vf0.query_rss) == (None,) * 4
    assert vf0.driver is None  # on its default driver: nothing to declare


def test_igb_802_1ad_is_a_comment() -> None:
    vf = igb_vf(0)
    vf = replace(vf, settings=replace(IGB_VF, vlan_proto="802.1ad"))
    text = snapshot(node(igb_pf(vf)))
    assert '# vlan_proto = "802.1ad"  (igb sets only 802.1Q)' in text
    assert parsed(text).sriov[0].vf[0].vlan_proto is None


def test_unbound_and_vfio_vfs_keep_their_binding() -> None:
    vfs = (igb_vf(0, "vfio-pci", "vfio-pci"), igb_vf(1, None, NO_DRIVER), igb_vf(2, "vfio-pci"))
    text, actions = round_trip(node(igb_pf(*vfs)))
    assert actions == []
    assert [v.driver for v in parsed(text).sriov[0].vf] == ["vfio-pci", "none", "vfio-pci"]


def test_vf_unbound_by_hand_is_declared_none_and_only_pinned() -> None:
    """Unbound without driver_override: a re-probe would bind it again, so the daemon pins
    it (driver_override = none) and changes nothing else; the binding stays as it is."""
    text, actions = round_trip(node(igb_pf(igb_vf(0), igb_vf(1, None, None))))
    assert 'driver = "none"' in text
    assert actions == [
        BindVfDriver(
            "sriov pci=0000:01:00.0", "VF 1 is declared unbound (driver = none)",
            vf_pci="0000:01:10.1", old=None, new=NO_DRIVER, override_old=None,
        )
    ]  # fmt: skip


def test_without_autoprobe_the_default_driver_is_declared() -> None:
    text, actions = round_trip(node(igb_pf(igb_vf(0), autoprobe=False)))
    assert actions == []
    assert 'driver = "igbvf"  # 0000:01:00.0 has sriov_drivers_autoprobe = 0' in text


def test_unknown_settings_and_invisible_vfs_are_said() -> None:
    """A truncated VF list (or no netlink) leaves settings unknown: a comment, not silence."""
    vfs = tuple(replace(igb_vf(i), settings=None if i >= 2 else IGB_VF) for i in range(5))
    p = replace(
        igb_pf(*vfs),
        numvfs=7,
        settings_note="truncated VF list: the kernel reported 2 of 7 VFs",
    )
    text, actions = round_trip(node(p))
    assert actions == []
    assert (
        "# VF 2-4: settings unknown (truncated VF list: the kernel reported 2 of 7 VFs), "
        "so not declared" in text
    )
    assert "# VF 5-6: not visible, so nothing of them is declared" in text
    assert [v.index for v in parsed(text).sriov[0].vf] == [0, 1]


def test_unset_and_undeclarable_values_are_left_out_with_a_comment() -> None:
    odd = VfSettings("01:00:5e:00:00:01", 7, 1, "0x0000", None, None, "3", 500, 100, None)
    p = replace(netdevsim_pf(), vfs=(VfObserved(0, "netdevsim1/vf0", settings=odd),),
                            numvfs=1)  # fmt: skip
    text, actions = round_trip(node(p))
    # The one change: a vlan declared without a protocol is 802.1Q, an unknown one is not kept.
    [action] = actions
    assert isinstance(action, SetVfSettings)
    assert [(c.attr, c.old, c.new) for c in action.changes] == [("vlan_proto", "0x0000", "802.1Q")]
    assert '# mac reads as "01:00:5e:00:00:01": not a unicast MAC' in text
    assert '# vlan_proto reads as "0x0000" (unknown); vlan alone means 802.1Q' in text
    assert '# link_state reads as "3": ' in text
    assert "# min_tx_rate reads as 500: above max_tx_rate 100; left out" in text
    assert "so not declared: spoofchk, trust, query_rss" in text
    vf0 = parsed(text).sriov[0].vf[0]
    assert (vf0.vlan, vf0.qos, vf0.max_tx_rate, vf0.mac, vf0.vlan_proto) == (7, 1, 100, None, None)


def test_rxe_link_without_netdev_is_said_not_declared() -> None:
    text, actions = round_trip(node(rdma=(RdmaLinkObserved("rxe3", "rxe", None),)))
    assert actions == [] and "[[rxe]]" not in text
    assert "# rxe link rxe3 has no netdev now, so it is not declared" in text


def test_a_mac_two_vfs_of_a_pf_share_is_declared_once() -> None:
    """Two VFs of one PF set by hand to one MAC: the config may declare it for one of
    them (a second is an error naming both); the other's is written as a comment."""
    text, actions = round_trip(node(igb_pf(igb_vf(0), igb_vf(1))))
    assert actions == []
    [sriov] = parsed(text).sriov
    assert [v.mac for v in sriov.vf] == ["02:00:00:00:01:00", None]
    assert '# mac = "02:00:00:00:01:00"  (VF 0\'s too: declared for one VF of a PF)' in text


def test_exclusive_rdma_netns_mode_round_trips() -> None:
    """Exclusive was chosen by someone and is lost at boot unless declared; shared is the
    kernel's default and is left undeclared. Declared, it plans only the modprobe.d option
    (the kernel already has the mode)."""
    seen = RdmaSysObserved(netns_mode="exclusive")
    text, actions = round_trip(Observed(rdma_sys=seen))
    assert '[rdma]\nnetns_mode = "exclusive"' in text
    assert [type(a) for a in actions] == [SyncIbCoreOptions]
    with_option = RdmaSysObserved(netns_mode="exclusive", boot_mode="exclusive", boot_file=True)
    assert round_trip(Observed(rdma_sys=with_option))[1] == []
    text, actions = round_trip(Observed(rdma_sys=RdmaSysObserved(netns_mode="shared")))
    assert "[rdma]" not in text and actions == []
