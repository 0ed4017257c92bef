"""rdmad.kernel.usage on fake trees: who holds a VF or an RDMA device; unknown means in use."""

from __future__ import annotations

from pathlib import Path

from rdmad.kernel.sysfs import Sysfs
from rdmad.kernel.usage import OpenFiles, libvirt_hostdevs, rdma_device_usage, vf_usage
from rdmad.model import Use
from tests.support.fakesysfs import MLX5_VFS, QEMU_PID, mlx5_node


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


def test_unreadable_processes_make_usage_unknown(tmp_path: Path) -> None:
    mlx5_node(tmp_path)
    sysfs = Sysfs(tmp_path)
    files = OpenFiles(unreadable=["99"])
    usage = vf_usage(sysfs, files, {}, MLX5_VFS[3])
    assert usage.state is Use.UNKNOWN and "pid 99" in usage.describe()
    assert rdma_device_usage(sysfs, files, "mlx5_0").state is Use.UNKNOWN
