"""Which PCI function a netdev belongs to: plain PCI NICs, virtio NICs, virtual links."""

from __future__ import annotations

from pathlib import Path

from rdmad.kernel.sysfs import Sysfs
from tests.support.fakesysfs import DEV, FakeSysfs


def test_virtio_nic_resolves_to_its_pci_function(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    fs.pci("0000:00:02.0", "virtio-pci")
    # Real layout: .../0000:00:02.0/virtio0/net/enp0s2, device -> ../../../virtio0
    virtio = f"{DEV}/0000:00:02.0/virtio0"
    fs.link(f"{virtio}/subsystem", "../../../../bus/virtio")
    (tmp_path / "sys/bus/virtio").mkdir(parents=True)
    fs.write(f"{virtio}/net/enp0s2/address", "52:54:00:12:34:56")
    fs.link(f"{virtio}/net/enp0s2/device", "../../../virtio0")
    fs.link("sys/class/net/enp0s2", "../../devices/pci0000:00/0000:00:02.0/virtio0/net/enp0s2")
    fs.pf("0000:01:00.0", "igb", totalvfs=7)
    fs.netdev("enp1s0", "0000:01:00.0", "52:54:00:00:00:01")
    fs.netdev("veth0", None, "ae:00:00:00:00:01")
    s = Sysfs(tmp_path)
    assert s.netdev_pci("enp0s2") == "0000:00:02.0"
    assert s.netdev_pci("enp1s0") == "0000:01:00.0"
    assert s.netdev_pci("veth0") is None
    assert s.netdev_pci("nosuch") is None
