"""SR-IOV on a real 6.1 kernel: igb (real driver path) and netdevsim (full VF attribute set)."""

from __future__ import annotations

from typing import Any

import pytest
from harness import ExecResult, Guest

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

NSIM_ID = 11


def _vf(guest: Guest, pf_netdev: str, index: int) -> dict[str, Any]:
    entries = [e for e in guest.vf_info(pf_netdev) if e["vf"] == index]
    assert entries, f"VF {index} missing from vfinfo_list of {pf_netdev}"
    return entries[0]


def _ip_vf(guest: Guest, pf_netdev: str, index: int, attrs: str) -> ExecResult:
    return guest.run(f"ip link set dev {pf_netdev} vf {index} {attrs}")


def test_igb_numvfs_creates_vf_pci_devices_and_netdevs(guest: Guest) -> None:
    pf = guest.igb_pf()
    assert int(guest.read(guest.pci_path(pf, "sriov_totalvfs"))) == 7
    assert guest.set_numvfs(pf, 2).ok

    by_pci = guest.wait_vf_netdevs(pf, 2, timeout=60)

    assert len(by_pci) == 2
    links = {link["ifname"]: link for link in guest.ip_links()}
    for bdf, name in by_pci.items():
        assert (
            guest.check(f"basename $(readlink {guest.pci_path(bdf, 'driver')})").strip() == "igbvf"
        )
        # Matched by PCI address: udev renames ethN after the VF appears.
        assert links[name]["parentdev"] == bdf
        assert not name.startswith("eth"), f"{name} was not renamed by udev"


def test_igb_numvfs_rules_of_the_kernel(guest: Guest) -> None:
    pf = guest.igb_pf()
    assert guest.set_numvfs(pf, 2).ok
    busy = guest.set_numvfs(pf, 3)
    assert not busy.ok and "busy" in busy.err.lower(), busy.describe()
    assert guest.numvfs(pf) == 2
    assert guest.set_numvfs(pf, 0).ok
    guest.wait_for(f"! ls -d {guest.pci_path(pf)}/virtfn* >/dev/null 2>&1", timeout=30)
    too_many = guest.set_numvfs(pf, 8)
    assert not too_many.ok and "out of range" in too_many.err.lower(), too_many.describe()
    assert guest.numvfs(pf) == 0


def test_igb_vf_attributes_read_back_from_the_kernel(guest: Guest) -> None:
    pf = guest.igb_pf()
    assert guest.set_numvfs(pf, 2).ok
    guest.wait_vf_netdevs(pf, 2)
    dev = guest.pci_netdevs(pf)[0]

    for attrs in ("mac 02:00:00:00:00:01", "vlan 100 qos 3", "spoofchk off", "trust on"):
        res = _ip_vf(guest, dev, 0, attrs)
        assert res.ok, f"igb refused {attrs}: {res.describe()}"

    vf0 = _vf(guest, dev, 0)
    assert vf0["address"] == "02:00:00:00:00:01"
    assert vf0["vlan_list"] == [{"vlan": 100, "qos": 3}]
    assert vf0["spoofchk"] is False
    assert vf0["trust"] is True
    vf1 = _vf(guest, dev, 1)
    assert vf1["spoofchk"] is True and vf1["trust"] is False  # untouched VF keeps defaults


@pytest.mark.parametrize(
    ("attrs", "error"),
    [
        ("state disable", "Operation not supported"),
        ("vlan 100 proto 802.1ad", "Protocol not supported"),
        ("query_rss on", "Operation not supported"),
        ("max_tx_rate 100", "Invalid argument"),
        ("min_tx_rate 10", "Invalid argument"),
    ],
)
def test_igb_rejects_what_it_does_not_support(guest: Guest, attrs: str, error: str) -> None:
    pf = guest.igb_pf()
    assert guest.set_numvfs(pf, 1).ok
    guest.wait_vf_netdevs(pf, 1)
    dev = guest.pci_netdevs(pf)[0]

    res = _ip_vf(guest, dev, 0, attrs)

    assert not res.ok
    assert error in res.err, res.describe()


def test_netdevsim_full_vf_attribute_set(guest: Guest) -> None:
    # 8 VFs: above netdevsim's default limit of 4, so max_vfs was really raised.
    dev = guest.nsim_create(NSIM_ID, numvfs=8, max_vfs=16)
    assert len(guest.vf_info(dev)) == 8

    res = _ip_vf(
        guest,
        dev,
        1,
        "mac 02:00:00:00:01:01 vlan 200 qos 2 proto 802.1ad "
        "spoofchk on trust on state disable query_rss on min_tx_rate 10 max_tx_rate 100",
    )
    assert res.ok, res.describe()

    vf1 = _vf(guest, dev, 1)
    assert vf1["address"] == "02:00:00:00:01:01"
    assert vf1["vlan_list"] == [{"vlan": 200, "qos": 2, "protocol": "802.1ad"}]
    assert vf1["spoofchk"] is True
    assert vf1["trust"] is True
    assert vf1["link_state"] == "disable"
    assert vf1["query_rss_en"] is True
    assert vf1["rate"] == {"max_tx": 100, "min_tx": 10}


def test_netdevsim_numvfs_change_must_pass_through_zero(guest: Guest) -> None:
    guest.nsim_create(NSIM_ID, numvfs=4)
    path = f"/sys/bus/netdevsim/devices/netdevsim{NSIM_ID}/sriov_numvfs"
    busy = guest.write(path, 2)
    assert not busy.ok and "busy" in busy.err.lower(), busy.describe()
    assert guest.write(path, 0).ok
    assert guest.write(path, 2).ok
    assert guest.read(path) == "2"


def test_modprobe_r_igb_with_vfs_succeeds_and_the_vfs_are_gone(guest: Guest) -> None:
    pf = guest.igb_pf()
    assert guest.set_numvfs(pf, 7).ok
    vfs = list(guest.wait_vf_netdevs(pf, 7))
    assert len(vfs) == 7

    res = guest.modprobe("igb", remove=True)

    # The kernel does not refuse: a guard has to (LAB.md).
    assert res.ok, res.describe()
    assert not guest.module_loaded("igb")
    for bdf in vfs:
        assert not guest.exists(guest.pci_path(bdf)), f"VF {bdf} survived the PF driver"
    assert guest.modprobe("igb").ok
    guest.wait_for("ls -d /sys/bus/pci/drivers/igb/0000:* >/dev/null 2>&1", timeout=60)
    assert guest.numvfs(guest.igb_pf()) == 0  # a driver reload loses the VFs


def test_vf_bound_to_vfio_with_its_group_held_open(guest: Guest) -> None:
    pf = guest.igb_pf()
    assert guest.set_numvfs(pf, 2).ok
    vf = next(iter(guest.wait_vf_netdevs(pf, 2)))

    group = guest.bind_vfio(vf)
    unit, pid = guest.hold_open(f"/dev/vfio/{group}")

    driver = guest.check(f"basename $(readlink {guest.pci_path(vf, 'driver')})").strip()
    assert driver == "vfio-pci"
    assert guest.pci_netdevs(vf) == []  # no netdev while vfio owns it
    assert guest.pids_holding(f"/dev/vfio/{group}") == [pid]

    guest.stop_unit(unit)
    guest.wait_for(f"! test -d /proc/{pid}", timeout=30)
    assert guest.pids_holding(f"/dev/vfio/{group}") == []
