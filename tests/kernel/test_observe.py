"""rdmad.kernel.apply.observe on fake trees, with and without netlink's LinkInfo."""

from __future__ import annotations

import errno
from pathlib import Path

import msgspec

from rdmad.kernel.apply.observe import observe, observe_changed
from rdmad.kernel.netlink.rtnl_codec import LinkInfo
from rdmad.kernel.sysfs import Sysfs
from rdmad.kernel.sysfs_files import Unreadable
from rdmad.model import (
    Desired,
    NetdevObserved,
    NotServing,
    Observed,
    PlanState,
    RdmaLinkObserved,
    Usage,
    Use,
    VfSettings,
)
from rdmad.model.validation import validate
from rdmad.reconcile import plan
from tests.support.fakesysfs import IGB_PF, MLX5_PF, MLX5_VFS, QEMU_PID, FakeSysfs, mlx5_node
from tests.support.records import replace


def test_demo_tree_from_sysfs_alone(tmp_path: Path) -> None:
    mlx5_node(tmp_path)
    obs = observe(Sysfs(tmp_path), no_netlink_reason="netlink not read here")
    mlx5 = next(p for p in obs.pfs if p.pci == MLX5_PF)
    assert (mlx5.numvfs, mlx5.totalvfs, mlx5.ib_device) == (4, 8, "mlx5_0")
    assert mlx5.settings_note == "netlink not read here"
    assert [v.driver for v in mlx5.vfs] == ["mlx5_core", "vfio-pci", "mlx5_core", None]
    assert all(v.settings is None for v in mlx5.vfs)  # unknown, never guessed
    vf1 = mlx5.vf(1)
    assert vf1 is not None and vf1.usage.state is Use.IN_USE
    assert f"pid {QEMU_PID}" in vf1.usage.describe()
    assert vf1.ib is not None and vf1.ib.policy == "Follow"
    igb = next(p for p in obs.pfs if p.pci == IGB_PF)
    assert (igb.numvfs, igb.totalvfs, igb.netdev) == (0, 7, "enp94s0f0")
    eth0 = obs.netdev("eth0")
    assert eth0 is not None and eth0.up and eth0.pci == "0000:00:03.0"
    assert obs.rdma_link("mlx5_0") is not None and obs.rdma_netlink
    assert "rdma_rxe" in obs.modules.loaded and not obs.modules.loading_disabled


def test_link_info_supplies_vf_settings_and_link_state(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    fs.write(f"sys/devices/pci0000:00/{IGB_PF}/sriov_numvfs", "2")
    fs.vf(IGB_PF, 0, "0000:5e:10.0", "igbvf", iommu_group=70)
    fs.vf(IGB_PF, 1, "0000:5e:10.2", "igbvf", iommu_group=71)
    fs.netdev("enp94s0v0", "0000:5e:10.0", "02:00:00:00:00:01")
    fs.netdev("enp94s0v1", "0000:5e:10.2", "02:00:00:00:00:02")
    vfs = {0: VfSettings(mac="02:00:00:00:00:01", vlan=100, qos=0, trust=True)}
    links = {
        "enp94s0f0": LinkInfo(
            "enp94s0f0",
            40,
            "52:54:00:12:34:56",
            "52:54:00:12:34:00",
            False,
            "down",
            None,
            num_vf=2,
            vfs=vfs,
            vfs_complete=False,
        ),
        "eth0": LinkInfo("eth0", 41, "52:54:00:ab:cd:ef", None, False, "down", None),
    }
    obs = observe(Sysfs(tmp_path), links)
    igb = next(p for p in obs.pfs if p.pci == IGB_PF)
    assert (igb.ifindex, igb.perm_mac, igb.operstate_up) == (40, "52:54:00:12:34:00", False)
    assert igb.vf(0).settings == vfs[0]  # type: ignore[union-attr]
    assert igb.vf(1).settings is None  # type: ignore[union-attr]
    assert igb.settings_note is not None and "truncated (1 of 2 VFs" in igb.settings_note
    eth0 = obs.netdev("eth0")
    assert eth0 is not None and (eth0.ifindex, eth0.up) == (41, False)  # netlink wins
    mlx5 = next(p for p in obs.pfs if p.pci == MLX5_PF)
    assert mlx5.settings_note is None  # netlink was read; its netdev just had no entry


def test_rdma_from_netlink_gets_driver_and_usage_from_sysfs(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    node = fs.uverbs(0, "mlx5_0")
    fs.process(555, "rping", node)
    fs.ib_device("rxe0", None, "00:00:00:00:00:00:00:01", netdev="eth0", link_layer="Ethernet")
    rdma = [
        RdmaLinkObserved("mlx5_0", None, "ibp59s0", 5),
        RdmaLinkObserved("rxe0", "rxe", "eth0", 2),
    ]
    obs = observe(Sysfs(tmp_path), None, rdma, rdma_netlink=True)
    mlx5 = obs.rdma_link("mlx5_0")
    assert mlx5 is not None and mlx5.driver == "mlx5_core"
    assert mlx5.usage.holders == ("pid 555 (rping) holds /dev/infiniband/uverbs0",)
    rxe = obs.rdma_link("rxe0")
    assert rxe is not None and rxe.is_rxe and rxe.usage.state is Use.FREE


def test_rxe_from_sysfs_and_no_rdma_netlink(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    fs.netdev("veth0", None, "02:00:00:00:00:0a")
    fs.ib_device("rxe0", None, "00:00:00:00:00:00:00:01", netdev="veth0", link_layer="Ethernet")
    obs = observe(Sysfs(tmp_path), rdma_netlink=False)
    rxe = obs.rdma_link("rxe0")
    assert rxe is not None and rxe.driver == "rxe" and rxe.netdev == "veth0"
    assert rxe.netdev_ifindex == obs.netdev("veth0").ifindex  # type: ignore[union-attr]
    assert not obs.rdma_netlink
    assert obs.pfs == ()


def test_rxe_from_sysfs_carries_its_port_state_and_gids(tmp_path: Path) -> None:
    """Read from sysfs (a pause, RDMA netlink failing), a DOWN rxe link with only its
    link-local GID is judged as over netlink: not serving, not converged."""
    fs = FakeSysfs(tmp_path)
    fs.netdev("veth0", None, "02:00:00:00:00:0a")
    fs.ib_device("rxe0", None, "00:00:00:00:00:00:00:01", netdev="veth0", link_layer="Ethernet")
    base = "sys/devices/virtual/infiniband/rxe0/ports/1"
    fs.write(f"{base}/state", "1: DOWN")
    fs.write(f"{base}/gids/0", "fe80:0000:0000:0000:0000:00ff:fe00:000a")
    fs.write(f"{base}/gids/1", "0000:0000:0000:0000:0000:0000:0000:0000")
    obs = observe(Sysfs(tmp_path), rdma_users_unknown="RDMA netlink failed: EIO")
    rxe = obs.rdma_link("rxe0")
    assert rxe is not None and rxe.port_state == "DOWN"
    assert rxe.gids == ("fe80:0000:0000:0000:0000:00ff:fe00:000a",)
    desired = validate(Desired, {"rxe": [{"name": "rxe0", "netdev": {"name": "veth0"}}]})
    actions = [a for a in plan(desired, obs, PlanState()) if a.obj == "rxe rxe0"]
    assert [type(a) for a in actions] == [NotServing], actions
    assert "DOWN" in actions[0].reason, actions


def test_modules_disabled_and_no_module_support_are_noted(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    fs.write("proc/sys/kernel/modules_disabled", "1")
    obs = observe(Sysfs(tmp_path))
    assert obs.modules.loading_disabled
    assert any("modules_disabled = 1" in n for n in obs.notes)
    (tmp_path / "proc/sys/kernel/modules_disabled").unlink()
    obs = observe(Sysfs(tmp_path))
    assert obs.modules.loading_disabled and any("no loadable module" in n for n in obs.notes)


def test_mlx5_vfs_constant_matches_tree(tmp_path: Path) -> None:
    mlx5_node(tmp_path)
    assert tuple(Sysfs(tmp_path).virtfns(MLX5_PF).values()) == MLX5_VFS


def test_rdma_usage_from_netlink_is_combined_with_uverbs_holders(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    fs.process(556, "ib_send_bw", fs.uverbs(0, "mlx5_0"))
    kernel = Usage(Use.IN_USE, ("kernel user rpcrdma: 2 QPs",))
    unknown = Usage(Use.UNKNOWN, ("resource tracking could not be read",))
    rdma = [
        RdmaLinkObserved("mlx5_0", None, "ibp59s0", 5, usage=kernel),
        RdmaLinkObserved("mlx5_2", None, None, None, usage=unknown),
    ]
    obs = observe(Sysfs(tmp_path), None, rdma)
    mlx5 = obs.rdma_link("mlx5_0")
    assert mlx5 is not None and mlx5.usage.holders == (
        "kernel user rpcrdma: 2 QPs",
        "pid 556 (ib_send_bw) holds /dev/infiniband/uverbs0",
    )
    # RES_GET could not be read for VF0's own device: the VF counts as in use.
    vf0 = next(p for p in obs.pfs if p.pci == MLX5_PF).vf(0)
    assert vf0 is not None and vf0.usage == unknown


def test_rxe_on_a_vf_netdev_makes_the_vf_in_use_in_observe(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    fs.write(f"sys/devices/pci0000:00/{IGB_PF}/sriov_numvfs", "1")
    fs.vf(IGB_PF, 0, "0000:5e:10.0", "igbvf", iommu_group=70)
    fs.netdev("enp94s0v0", "0000:5e:10.0", "02:00:00:00:00:01")
    fs.ib_device("rxe0", None, "00:00:00:00:00:00:00:01", netdev="enp94s0v0")
    fs.process(557, "ibv_rc_pingpong", fs.uverbs(1, "rxe0"))
    for rdma in (None, [RdmaLinkObserved("rxe0", "rxe", "enp94s0v0", None)]):
        obs = observe(Sysfs(tmp_path), None, rdma)
        vf0 = next(p for p in obs.pfs if p.pci == IGB_PF).vf(0)
        assert vf0 is not None and vf0.usage.state is Use.IN_USE
        assert vf0.usage.holders == (
            "enp94s0v0 carries rxe link rxe0",
            "pid 557 (ibv_rc_pingpong) holds /dev/infiniband/uverbs1",
        )


def test_pf_and_vf_netdev_is_the_functions_own_not_a_representor(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    pf = "0000:3b:00.0"
    fs.pf(pf, "mlx5_core", totalvfs=4, numvfs=1)
    # switchdev: VF and PF representors sort before the uplink by name
    fs.netdev("eth0", pf, "02:00:00:00:01:01", phys_port_name="pf0vf0")
    fs.netdev("eth1", pf, "02:00:00:00:01:02", phys_port_name="pf0")
    fs.netdev("eth2", pf, "02:00:00:00:01:03", phys_port_name="c1pf0sf2")
    fs.netdev("ens1f0np0", pf, "02:00:00:00:01:00", phys_port_name="p0")
    # mlx4: two ports on one function, port 2 (dev_port 1) sorts first by name
    vf = "0000:3b:00.2"
    fs.vf(pf, 0, vf, "mlx4_core", iommu_group=5)
    fs.netdev("a_port2", vf, "02:00:00:00:02:02", dev_port=1)
    fs.netdev("b_port1", vf, "02:00:00:00:02:01", dev_port=0)
    obs = observe(Sysfs(tmp_path))
    (pfo,) = obs.pfs
    assert pfo.netdev == "ens1f0np0" and pfo.mac == "02:00:00:00:01:00"
    assert pfo.vf(0).netdev == "b_port1"  # type: ignore[union-attr]
    sysfs = Sysfs(tmp_path)
    assert sysfs.own_netdev(["eth0", "eth1"]) is None  # only representors
    assert sysfs.own_netdev([]) is None


# --- the event path's narrow observation ---------------------------------------------------


def _links(obs: Observed, *extra: LinkInfo) -> list[LinkInfo]:
    """What an rtnetlink dump would list for ``obs``'s netdevs, plus ``extra``."""
    same = [LinkInfo(n.name, n.ifindex, n.mac, n.perm_mac, n.up, "up", None) for n in obs.netdevs]
    return [*same, *extra]


def test_narrow_observation_adds_a_virtual_netdev_and_keeps_the_rest(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    full = observe(Sysfs(tmp_path))
    fs.netdev("veth7", None, "02:00:00:00:07:07")  # a virtual netdev: no PCI function
    veth = LinkInfo("veth7", 77, "02:00:00:00:07:07", None, True, "up", "veth")
    rxe = RdmaLinkObserved("rxe7", "rxe", "veth7", 77)
    narrow = observe_changed(Sysfs(tmp_path), full, _links(full, veth), [*full.rdma_links, rxe])
    assert narrow is not None
    assert narrow.netdev("veth7") == NetdevObserved(
        "veth7", 77, "02:00:00:00:07:07", None, None, True
    )
    assert narrow.rdma_link("rxe7") == rxe
    assert narrow.pfs is full.pfs and narrow.modules is full.modules  # carried, not re-read
    assert narrow.guard_hook == full.guard_hook


def test_narrow_observation_keeps_holders_it_did_not_rescan(tmp_path: Path) -> None:
    mlx5_node(tmp_path)
    held = Usage(Use.IN_USE, ("pid 42 (ib_write_bw)",))
    full = replace(
        observe(Sysfs(tmp_path)),
        rdma_links=(RdmaLinkObserved("rxe0", "rxe", "eth0", 2, usage=held),),
    )
    now_free = RdmaLinkObserved("rxe0", "rxe", "eth0", 2)
    narrow = observe_changed(Sysfs(tmp_path), full, _links(full), [now_free])
    assert narrow is not None and narrow.rdma_link("rxe0").usage == held  # type: ignore[union-attr]


def test_narrow_observation_declines_when_a_pci_netdev_is_involved(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    full = observe(Sysfs(tmp_path))
    sysfs = Sysfs(tmp_path)
    pci_dev = next(n for n in full.netdevs if n.pci is not None)
    # A new netdev of a PCI function (a VF's, after numvfs or a driver probe).
    fs.netdev("enp94s0v0", IGB_PF, "02:00:00:00:00:09")
    vf_link = LinkInfo("enp94s0v0", 90, "02:00:00:00:00:09", None, False, "down", None)
    assert observe_changed(sysfs, full, _links(full, vf_link), full.rdma_links) is None
    # A PCI function's netdev went away, or changed its address or state.
    others = [lk for lk in _links(full) if lk.name != pci_dev.name]
    assert observe_changed(sysfs, full, others, full.rdma_links) is None
    changed = [
        msgspec.structs.replace(lk, up=not lk.up) if lk.name == pci_dev.name else lk
        for lk in _links(full)
    ]
    assert observe_changed(sysfs, full, changed, full.rdma_links) is None
    # Nothing changed at all: the same snapshot's facts come back.
    same = observe_changed(sysfs, full, _links(full), full.rdma_links)
    assert same is not None and same.netdevs == full.netdevs


def test_narrow_observation_follows_virtual_netdevs_coming_and_going(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    full = observe(Sysfs(tmp_path))
    virtual = [n for n in full.netdevs if n.pci is None]
    fs.netdev("veth8", None, "02:00:00:00:08:08")
    veth = LinkInfo("veth8", 88, "02:00:00:00:08:08", None, False, "down", "veth")
    sysfs = Sysfs(tmp_path)
    added = observe_changed(sysfs, full, _links(full, veth), None)
    assert added is not None and added.netdevs == (*full.netdevs, added.netdev("veth8"))
    assert added.rdma_links is full.rdma_links  # not asked: carried
    removed = observe_changed(sysfs, added, _links(full), None)
    assert removed is not None and removed.netdevs == full.netdevs
    if virtual:  # a virtual netdev may go without a full observation
        rest = [i for i in _links(full) if i.ifindex != virtual[0].ifindex]
        others = observe_changed(sysfs, full, rest, None)
        assert others is not None and virtual[0] not in others.netdevs
    pci = next(n for n in full.netdevs if n.pci is not None)
    rest = [i for i in _links(full) if i.ifindex != pci.ifindex]
    assert observe_changed(sysfs, full, rest, None) is None


def test_news_change_only_the_links_they_name(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    full = observe(Sysfs(tmp_path))
    sysfs = Sysfs(tmp_path)
    fs.netdev("veth8", None, "02:00:00:00:08:08")
    veth = LinkInfo("veth8", 88, "02:00:00:00:08:08", None, False, "down", "veth")
    # The same as a dump listing every link, from the news of one.
    added = observe_changed(sysfs, full, [veth], None, gone=())
    assert added == observe_changed(sysfs, full, _links(full, veth), None)
    assert added is not None and added.netdev("veth8") is not None
    renamed = msgspec.structs.replace(veth, name="veth9", up=True)
    moved = observe_changed(sysfs, added, [renamed], None, gone=())
    assert moved is not None and moved.netdev("veth8") is None
    assert moved.netdev("veth9") == NetdevObserved("veth9", 88, veth.mac, None, None, True)
    deleted = observe_changed(sysfs, moved, [], None, gone={88})
    assert deleted is not None and deleted.netdevs == full.netdevs
    # A PCI function's netdev deleted or changed: everything must be read.
    pci = next(n for n in full.netdevs if n.pci is not None)
    assert observe_changed(sysfs, full, [], None, gone={pci.ifindex}) is None
    flapped = LinkInfo(pci.name, pci.ifindex, pci.mac, pci.perm_mac, not pci.up, "up", None)
    assert observe_changed(sysfs, full, [flapped], None, gone=()) is None


def test_narrow_observation_declines_when_a_representor_comes_or_goes(tmp_path: Path) -> None:
    """VF representors come and go with the eSwitch mode, and devlink tells nothing of a
    mode change: a representor seen going, or a new netdev of a device that is no PCI
    function (netdevsim's representors), makes the next look a full one."""
    fs = mlx5_node(tmp_path)
    sysfs = Sysfs(tmp_path)
    fs.netdev("eni41np1", None, "02:00:00:00:41:01")  # a netdevsim port: device on its bus
    fs.link("sys/devices/virtual/net/eni41np1/device", "../../../netdevsim/netdevsim41")
    rep = LinkInfo("eni41np1", 141, "02:00:00:00:41:01", None, True, "up", None)
    full = observe(sysfs)
    assert observe_changed(sysfs, full, _links(full, rep), full.rdma_links) is None
    # Carried as a representor by the last full look (devlink named it): its going counts.
    mlx5 = next(p for p in full.pfs if p.pci == MLX5_PF)
    vfs = (replace(mlx5.vfs[0], representor="eni41np1"), *mlx5.vfs[1:])
    netdev = NetdevObserved("eni41np1", 141, "02:00:00:00:41:01", None, None, True)
    with_rep = replace(
        full,
        pfs=tuple(replace(p, vfs=vfs) if p is mlx5 else p for p in full.pfs),
        netdevs=(*full.netdevs, netdev),
    )
    assert observe_changed(sysfs, with_rep, _links(full), full.rdma_links, gone=[141]) is None
    # Without it, a plain netdev without a device going is followed narrowly as before.
    assert observe_changed(sysfs, replace(with_rep, pfs=full.pfs), [], None, gone=[141])


def test_a_pf_netdev_udev_has_not_named_yet_is_pending_until_its_entry_exists(
    tmp_path: Path,
) -> None:
    fs = mlx5_node(tmp_path)
    down = LinkInfo("enp94s0f0", 40, "52:54:00:12:34:56", None, False, "down", None)
    up = LinkInfo("enp94s0f0", 40, "52:54:00:12:34:56", None, True, "up", None)

    def igb(links: LinkInfo) -> tuple[bool, Observed]:
        obs = observe(Sysfs(tmp_path), {"enp94s0f0": links})
        return next(p for p in obs.pfs if p.pci == IGB_PF).udev_pending, obs

    assert igb(down)[0] is False  # no udevd here (a container): nothing to wait for
    fs.write("run/udev/control", "")
    pending, obs = igb(down)
    assert pending is True  # udevd runs and has not written the netdev's entry
    # udev's event for it changes nothing rtnetlink reports: only a full look sees it.
    assert observe_changed(Sysfs(tmp_path), obs, _links(obs), None) is None
    assert igb(up)[0] is False  # up already: nothing rdmad would do can block a rename
    fs.write("run/udev/data/n40", "E:ID_NET_DRIVER=igb\n")
    assert igb(down)[0] is False


def test_a_failed_lookup_under_run_udev_is_pending_not_no_udevd(tmp_path: Path) -> None:
    """A lookup under /run/udev that fails (EACCES here) is unknown: read as "udevd may
    run and has not processed it", which waits, never as "no udevd", which would set a
    PF up before udev names it."""
    fs = mlx5_node(tmp_path)
    fs.pf("0000:01:00.0", "", 7, vendor="0x8086", device="0x10c9")  # no driver bound
    down = LinkInfo("enp94s0f0", 40, "52:54:00:12:34:56", None, False, "down", None)

    class Refused(Sysfs):
        def present(self, rel: str) -> bool:
            if rel.startswith("run/udev/"):
                raise Unreadable("look up", rel, PermissionError(errno.EACCES, "Permission denied"))
            return super().present(rel)

    def pending(sysfs: Sysfs) -> dict[str, bool]:
        obs = observe(sysfs, {"enp94s0f0": down})
        return {p.pci: p.udev_pending for p in obs.pfs if p.pci in ("0000:01:00.0", IGB_PF)}

    assert pending(Refused(tmp_path)) == {"0000:01:00.0": True, IGB_PF: True}
    # What could not be read, for the words: the first lookup that failed.
    unread = {p.pci: p.udev_unread for p in observe(Refused(tmp_path), {"enp94s0f0": down}).pfs}
    assert unread["0000:01:00.0"] == unread[IGB_PF] == "/run/udev/control"
    # Looked up and not there: no udevd (a container), nothing to wait for.
    assert pending(Sysfs(tmp_path)) == {"0000:01:00.0": False, IGB_PF: False}
    assert not any(p.udev_unread for p in observe(Sysfs(tmp_path), {"enp94s0f0": down}).pfs)


def test_a_pf_with_no_driver_is_pending_until_udev_has_processed_its_pci_device(
    tmp_path: Path,
) -> None:
    """At boot, before coldplug reached it: udev loads the driver its modalias names."""
    fs = FakeSysfs(tmp_path)
    fs.pf("0000:01:00.0", "", 7, vendor="0x8086", device="0x10c9")  # no driver bound

    def pending() -> dict[str, bool]:
        obs = observe(Sysfs(tmp_path), {})
        return {p.pci: p.udev_pending for p in obs.pfs}

    assert pending() == {"0000:01:00.0": False}  # no udevd (a container)
    fs.write("run/udev/control", "")
    assert pending() == {"0000:01:00.0": True}
    obs = observe(Sysfs(tmp_path), {})
    assert observe_changed(Sysfs(tmp_path), obs, [], None) is None  # a full look each pass
    fs.write("run/udev/data/+pci:0000:01:00.0", "E:ID_VENDOR_FROM_DATABASE=Intel Corporation\n")
    assert pending() == {"0000:01:00.0": False}  # processed, and still no driver
