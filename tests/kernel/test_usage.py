"""rdmad.kernel.usage.holders on fake trees: who holds a VF or an RDMA device; unknown means
in use."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rdmad.kernel.sysfs import Sysfs
from rdmad.kernel.usage.holders import (
    Libvirt,
    Namespaces,
    OpenFiles,
    combine,
    libvirt_hostdevs,
    rdma_device_usage,
    rdma_link_usage_now,
    vf_usage,
    vf_usage_now,
)
from rdmad.kernel.usage.netns import ForeignNetdev, NetnsQuery
from rdmad.model import FREE, RdmaLinkObserved, Usage, Use
from tests.support.fakesysfs import IGB_PF, MLX5_VFS, QEMU_PID, FakeSysfs, mlx5_node
from tests.support.netns import owned_netns, wait_entered

IGB_VF0 = "0000:5e:10.0"
IGB_VF1 = "0000:5e:10.2"


def test_vfio_vf_held_by_qemu_names_the_pid(tmp_path: Path) -> None:
    mlx5_node(tmp_path)
    sysfs = Sysfs(tmp_path)
    files = OpenFiles.scan(sysfs)
    usage = vf_usage(sysfs, files, {}, MLX5_VFS[1])
    assert usage.state is Use.IN_USE
    assert usage.holders == (f"pid {QEMU_PID} (qemu-system-x86) holds /dev/vfio/61",)
    assert vf_usage(sysfs, files, {}, MLX5_VFS[0]).state is Use.FREE  # has its IB device
    assert vf_usage(sysfs, files, {}, MLX5_VFS[3]).state is Use.FREE  # unbound
    assert vf_usage(sysfs, files, {}, "0000:99:00.0").state is Use.FREE  # gone


def test_netdev_elsewhere_is_unknown_and_counts_as_in_use(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    fs.vf("0000:5e:00.0", 0, "0000:5e:10.0", "igbvf", iommu_group=70)  # no netdev here
    sysfs = Sysfs(tmp_path)
    usage = vf_usage(sysfs, OpenFiles.scan(sysfs), {}, "0000:5e:10.0")
    assert usage.state is Use.UNKNOWN and usage.busy
    assert "not in this network namespace" in usage.describe()


def test_uverbs_and_libvirt(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    node = fs.uverbs(3, "mlx5_2")
    fs.process(777, "ib_write_bw", node)
    (tmp_path / "run/libvirt/qemu").mkdir(parents=True)
    (tmp_path / "run/libvirt/qemu/vm1.xml").write_text(
        "<domstatus><domain><name>vm1</name><devices><hostdev><source>"
        "<address domain='0x0000' bus='0x3b' slot='0x00' function='0x3'/>"
        "</source></hostdev></devices></domain></domstatus>"
    )
    sysfs = Sysfs(tmp_path)
    files = OpenFiles.scan(sysfs)
    ib = rdma_device_usage(sysfs, files, "mlx5_2")
    assert ib.holders == ("pid 777 (ib_write_bw) holds /dev/infiniband/uverbs3",)
    libvirt = libvirt_hostdevs(sysfs)
    assert libvirt == {"0000:3b:00.3": "vm1"}
    vf0 = vf_usage(sysfs, files, libvirt, MLX5_VFS[0])
    assert vf0.holders == ("pid 777 (ib_write_bw) holds /dev/infiniband/uverbs3",)
    vf1 = vf_usage(sysfs, files, libvirt, MLX5_VFS[1])
    assert "libvirt domain 'vm1' has it as a hostdev" in vf1.holders


def test_unreadable_open_files_make_usage_unknown_naming_pid_and_comm(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    fs.write("proc/99/comm", "secretd")
    fs.write("proc/99/fd", "")  # not a directory: its fds cannot be listed
    sysfs = Sysfs(tmp_path)
    files = OpenFiles.scan(sysfs)
    assert files.unreadable == ["pid 99 (secretd)"]
    usage = vf_usage(sysfs, files, {}, MLX5_VFS[3])
    assert usage.state is Use.UNKNOWN
    assert usage.holders == ("open files of pid 99 (secretd) could not be read",)
    assert rdma_device_usage(sysfs, files, "mlx5_0").state is Use.UNKNOWN
    # a VF somebody holds stays IN_USE: the known holder is what an operator needs
    assert vf_usage(sysfs, files, {}, MLX5_VFS[1]).state is Use.IN_USE


def test_unreadable_fds_of_a_real_process_are_named(tmp_path: Path) -> None:
    """As an unprivileged user, root's processes' fds on this real /proc are unreadable."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start a scan as another user")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child drops to nobody and scans this host's /proc
        try:
            os.close(read_end)
            os.setgid(65534)
            os.setuid(65534)
            os.write(write_end, repr(OpenFiles.scan(Sysfs("/")).unknown()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as fh:
        out = fh.read()
    os.waitpid(pid, 0)
    assert "state=<Use.UNKNOWN" in out and "pid 1 (" in out and "could not be read" in out


def test_combine_in_use_beats_unknown_beats_free() -> None:
    a = Usage(Use.IN_USE, ("pid 1 (x) holds /dev/infiniband/uverbs0",))
    u = Usage(Use.UNKNOWN, ("open files of pid 2 (y) could not be read",))
    assert combine() is FREE and combine(FREE, FREE) is FREE
    assert combine(FREE, u) == u
    both = combine(u, FREE, a, a)
    assert both.state is Use.IN_USE
    assert both.holders == (u.holders[0], a.holders[0])  # in order, no repeats


def igb_with_vfs(root: Path) -> FakeSysfs:
    """The demo node with igb VF 0 and 1 on igbvf, netdevs enp94s0v0/enp94s0v1."""
    fs = mlx5_node(root)
    fs.write(f"sys/devices/pci0000:00/{IGB_PF}/sriov_numvfs", "2")
    fs.vf(IGB_PF, 0, IGB_VF0, "igbvf", iommu_group=70)
    fs.vf(IGB_PF, 1, IGB_VF1, "igbvf", iommu_group=71)
    fs.netdev("enp94s0v0", IGB_VF0, "02:00:00:00:00:01")
    fs.netdev("enp94s0v1", IGB_VF1, "02:00:00:00:00:02")
    return fs


def rxe_on(fs: FakeSysfs, name: str, netdev: str, uverbs: int) -> str:
    fs.ib_device(name, None, "00:00:00:00:00:00:00:0a", netdev=netdev, link_layer="Ethernet")
    return fs.uverbs(uverbs, name)


def test_rxe_link_on_a_vf_netdev_makes_the_vf_busy_with_its_holders(tmp_path: Path) -> None:
    fs = igb_with_vfs(tmp_path)
    node = rxe_on(fs, "rxe0", "enp94s0v0", 5)
    fs.process(321, "ibv_rc_pingpong", node)
    sysfs = Sysfs(tmp_path)
    files = OpenFiles.scan(sysfs)
    kernel = Usage(Use.IN_USE, ("kernel user rpcrdma: 2 QPs",))
    idx = sysfs.read_int("sys/class/net/enp94s0v0/ifindex")
    link = RdmaLinkObserved("rxe0", "rxe", "enp94s0v0", idx, usage=kernel)
    links = [link]
    usage = vf_usage(sysfs, files, {}, IGB_VF0, links)
    assert usage.state is Use.IN_USE
    assert usage.holders == ("enp94s0v0 carries rxe link rxe0", "kernel user rpcrdma: 2 QPs")
    # observe() hands vf_usage links whose usage already has the uverbs holders:
    now = vf_usage_now(sysfs, IGB_VF0, links)
    assert now.holders == (
        "enp94s0v0 carries rxe link rxe0",
        "kernel user rpcrdma: 2 QPs",
        "pid 321 (ibv_rc_pingpong) holds /dev/infiniband/uverbs5",
    )
    assert vf_usage(sysfs, files, {}, IGB_VF1, links) is FREE  # the other VF


def test_an_unheld_rxe_link_still_makes_the_vf_busy(tmp_path: Path) -> None:
    # The kernel hang needs only the link and a user we may not see (kernel users).
    fs = igb_with_vfs(tmp_path)
    rxe_on(fs, "rxe1", "enp94s0v1", 6)
    sysfs = Sysfs(tmp_path)
    link = RdmaLinkObserved("rxe1", "rxe", "enp94s0v1", None)
    usage = vf_usage_now(sysfs, IGB_VF1, [link])
    assert usage.state is Use.IN_USE and usage.holders == ("enp94s0v1 carries rxe link rxe1",)


def test_rdma_link_matched_by_ifindex_when_the_name_is_stale(tmp_path: Path) -> None:
    fs = igb_with_vfs(tmp_path)
    sysfs = Sysfs(tmp_path)
    idx = sysfs.read_int("sys/class/net/enp94s0v0/ifindex")
    link = RdmaLinkObserved("rxe0", "rxe", "eth7", idx)  # seen before udev renamed it
    usage = vf_usage(sysfs, OpenFiles.scan(sysfs), {}, IGB_VF0, [link])
    assert usage.holders == ("enp94s0v0 carries rxe link rxe0",)
    del fs


def test_own_rdma_device_busy_only_with_users(tmp_path: Path) -> None:
    mlx5_node(tmp_path)  # VF0 carries its own mlx5_2
    sysfs = Sysfs(tmp_path)
    files = OpenFiles.scan(sysfs)
    free = RdmaLinkObserved("mlx5_2", "mlx5_core", None, None)
    assert vf_usage(sysfs, files, {}, MLX5_VFS[0], [free]) is FREE
    users = Usage(Use.IN_USE, ("kernel user ib_ipoib: 1 QP",))
    held = RdmaLinkObserved("mlx5_2", "mlx5_core", None, None, usage=users)
    assert vf_usage(sysfs, files, {}, MLX5_VFS[0], [held]) == users
    unknown = RdmaLinkObserved("mlx5_2", "mlx5_core", None, None, usage=Usage(Use.UNKNOWN))
    assert vf_usage(sysfs, files, {}, MLX5_VFS[0], [unknown]).state is Use.UNKNOWN


def test_rdma_link_usage_now_combines_netlink_and_a_fresh_scan(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    fs.netdev("veth0", None, "02:00:00:00:00:0a")
    node = rxe_on(fs, "rxe0", "veth0", 0)
    sysfs = Sysfs(tmp_path)
    link = RdmaLinkObserved("rxe0", "rxe", "veth0", None)
    assert rdma_link_usage_now(sysfs, link) is FREE
    fs.process(42, "ib_send_bw", node)  # started after the last observation
    kernel = Usage(Use.IN_USE, ("kernel user rdma_cm: 1 QP",))
    now = rdma_link_usage_now(sysfs, RdmaLinkObserved("rxe0", "rxe", "veth0", None, usage=kernel))
    assert now.holders == (
        "kernel user rdma_cm: 1 QP",
        "pid 42 (ib_send_bw) holds /dev/infiniband/uverbs0",
    )


def test_vfio_without_iommu_group_is_unknown(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    (tmp_path / f"sys/devices/pci0000:00/{MLX5_VFS[3]}/iommu_group").unlink()
    fs.bind(MLX5_VFS[3], "vfio-pci")
    usage = vf_usage_now(Sysfs(tmp_path), MLX5_VFS[3])
    assert usage.state is Use.UNKNOWN and "without an iommu_group" in usage.describe()


def test_vfio_iommufd_cdev_held_names_the_pid(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    fs.bind(MLX5_VFS[3], "vfio-pci")
    node = fs.vfio_cdev(MLX5_VFS[3], 0)
    sysfs = Sysfs(tmp_path)
    assert vf_usage_now(sysfs, MLX5_VFS[3]) is FREE
    fs.process(900, "qemu-kvm", "/dev/iommu", node)
    usage = vf_usage_now(sysfs, MLX5_VFS[3])
    assert usage.holders == ("pid 900 (qemu-kvm) holds /dev/vfio/devices/vfio0",)


def test_libvirt_interface_hostdev_and_unreadable_status(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    fs.libvirt_domain(
        "vm2",
        "<interface type='hostdev' managed='yes'><source><address type='pci' "
        "domain='0x0000' bus='0x3b' slot='0x00' function='0x4'/></source></interface>"
        "<hostdev mode='subsystem' type='usb'><source><address bus='1' device='3'/>"
        "</source></hostdev>",
    )
    sysfs = Sysfs(tmp_path)
    libvirt = Libvirt.scan(sysfs)
    assert libvirt.hostdevs == {MLX5_VFS[2]: "vm2"} and not libvirt.unreadable
    assert vf_usage_now(sysfs, MLX5_VFS[2]).holders == ("libvirt domain 'vm2' has it as a hostdev",)
    assert vf_usage_now(sysfs, MLX5_VFS[3]) is FREE
    fs.write("run/libvirt/qemu/vm3.xml", "<domstatus><domain>")  # cut short
    usage = vf_usage_now(sysfs, MLX5_VFS[3])
    assert usage.state is Use.UNKNOWN
    assert usage.holders == ("libvirt status /run/libvirt/qemu/vm3.xml could not be read",)


@dataclass
class FakeNetns:
    """rtnetlink's answers for Namespaces: peer netdevs and namespace file -> nsid."""

    netdevs: list[ForeignNetdev] = field(default_factory=list)
    nsids: dict[str, int] = field(default_factory=dict)
    asked: int = 0

    def foreign_netdevs(self) -> list[ForeignNetdev]:
        self.asked += 1
        return list(self.netdevs)

    def nsid_of(self, ns_file: str) -> int | None:
        return self.nsids.get(ns_file)


def test_netdev_in_another_namespace_is_in_use_naming_it(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    fs.vf(IGB_PF, 0, IGB_VF0, "igbvf", iommu_group=70)  # its netdev is elsewhere
    fs.write("run/netns/tenant1", "")
    fs.write("run/netns/other", "")
    fs.process(2001, "sleep")
    fs.write("proc/2001/ns/net", "")
    sysfs = Sysfs(tmp_path)
    backend = FakeNetns(
        [ForeignNetdev(3, "eth1", IGB_VF0, "pci"), ForeignNetdev(4, "lo", None, None)],
        {sysfs.path("run/netns/tenant1"): 3, sysfs.path("proc/2001/ns/net"): 3},
    )
    ns = Namespaces(sysfs, backend)
    usage = vf_usage(sysfs, OpenFiles.scan(sysfs), {}, IGB_VF0, (), ns)
    assert usage.state is Use.IN_USE
    assert usage.holders == ("netdev eth1 is in network namespace 'tenant1' (pid 2001 (sleep))",)
    assert backend.asked == 1
    assert vf_usage(sysfs, OpenFiles.scan(sysfs), {}, MLX5_VFS[1], (), ns).state is Use.IN_USE
    assert backend.asked == 1  # one lookup serves the whole observation


def test_netdev_nowhere_to_be_found_is_unknown(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    fs.vf(IGB_PF, 0, IGB_VF0, "igbvf", iommu_group=70)
    sysfs = Sysfs(tmp_path)
    usage = vf_usage(sysfs, OpenFiles.scan(sysfs), {}, IGB_VF0, (), Namespaces(sysfs, FakeNetns()))
    assert usage.state is Use.UNKNOWN and usage.busy
    assert "not in this network namespace and was not found" in usage.describe()
    # On a tree (not the live host) nobody asks this host's rtnetlink.
    usage = vf_usage_now(sysfs, IGB_VF0)
    assert usage.state is Use.UNKNOWN and "not looked up for the tree" in usage.describe()


def _pod_vf(tmp_path: Path, link_layer: str) -> tuple[Sysfs, str]:
    """An mlx5 VF on mlx5_core whose RDMA device stayed here (RDMA netns mode shared)
    and whose netdev is not here: as the SR-IOV CNI leaves a pod's VF."""
    fs = FakeSysfs(tmp_path)
    pf, vf = "0000:af:00.0", "0000:af:00.2"
    fs.pf(pf, "mlx5_core", totalvfs=8, numvfs=1)
    fs.vf(pf, 0, vf, "mlx5_core", iommu_group=90)
    fs.ib_device("mlx5_5", vf, "00:00:00:00:00:00:00:05", link_layer=link_layer)
    return Sysfs(tmp_path), vf


@pytest.mark.parametrize("link_layer", ["Ethernet", "InfiniBand"])
def test_a_pods_vf_with_its_rdma_device_left_here_is_in_use(
    tmp_path: Path, link_layer: str
) -> None:
    sysfs, vf = _pod_vf(tmp_path, link_layer)
    backend = FakeNetns([ForeignNetdev(3, "net1", vf, "pci")], {})
    usage = vf_usage(sysfs, OpenFiles.scan(sysfs), {}, vf, (), Namespaces(sysfs, backend))
    assert usage.state is Use.IN_USE
    assert usage.holders == ("netdev net1 is in network namespace nsid 3 (no process in it)",)


def test_a_roce_vf_whose_netdev_is_nowhere_is_unknown(tmp_path: Path) -> None:
    # A RoCE function always has a netdev: not here and not found is not "free".
    sysfs, vf = _pod_vf(tmp_path, "Ethernet")
    usage = vf_usage(sysfs, OpenFiles.scan(sysfs), {}, vf, (), Namespaces(sysfs, FakeNetns()))
    assert usage.state is Use.UNKNOWN
    assert "not found in another" in usage.describe()


def test_an_infiniband_vf_without_ipoib_is_free_once_looked_for(tmp_path: Path) -> None:
    sysfs, vf = _pod_vf(tmp_path, "InfiniBand")
    backend = FakeNetns()
    assert vf_usage(sysfs, OpenFiles.scan(sysfs), {}, vf, (), Namespaces(sysfs, backend)) is FREE
    assert backend.asked == 1  # it was looked for


class BrokenNetns(FakeNetns):
    def foreign_netdevs(self) -> list[ForeignNetdev]:
        raise OSError("rtnetlink: Operation not permitted")


def test_an_infiniband_vf_whose_look_failed_is_unknown(tmp_path: Path) -> None:
    sysfs, vf = _pod_vf(tmp_path, "InfiniBand")
    ns = Namespaces(sysfs, BrokenNetns())
    usage = vf_usage(sysfs, OpenFiles.scan(sysfs), {}, vf, (), ns)
    assert usage.state is Use.UNKNOWN
    assert "Operation not permitted" in usage.describe()


@pytest.fixture
def netns_with_veth() -> object:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    a, b = f"ru{os.getpid()}a", f"ru{os.getpid()}b"
    with owned_netns() as ns:
        holder = None
        try:
            subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=True)
            subprocess.run(["ip", "link", "set", b, "netns", ns], check=True)
            holder = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "300"])
            yield ns, b, holder
        finally:
            if holder is not None:
                holder.kill()
                holder.wait()
            subprocess.run(["ip", "link", "del", a], check=False, capture_output=True)


def test_real_kernel_names_the_namespace_a_netdev_moved_into(netns_with_veth: object) -> None:
    ns, moved, holder = netns_with_veth  # type: ignore[misc]
    with NetnsQuery() as q:
        nsid = q.nsid_of(f"/run/netns/{ns}")
        assert nsid is not None  # assigned by the kernel when the veth moved
        assert any(f.name == moved for f in q.netdevs_in(nsid))
        assert nsid in q.nsids()
        assert q.nsid_of("/etc/hostname") is None
    # The holder's namespace is found by inode; wait (bounded) until ip netns exec entered it.
    wait_entered(holder.pid, ns)
    label = Namespaces(Sysfs("/")).label(nsid)
    assert label.startswith(f"{ns!r} (") and f"pid {holder.pid} (sleep)" in label
