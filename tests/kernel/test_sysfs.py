"""rdmad.kernel.sysfs on fake trees: reads tolerate vanishing files, writes carry the errno."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from rdmad.kernel.errors import KernelError
from rdmad.kernel.sysfs import PCI_DEVICES, Sysfs
from rdmad.kernel.sysfs_files import SysfsFiles, Unreadable
from tests.support.failinject import FailAt
from tests.support.fakesysfs import DEV, IGB_PF, MLX5_PF, MLX5_VFS, mlx5_node


@pytest.fixture
def sysfs(tmp_path: Path) -> Sysfs:
    mlx5_node(tmp_path)
    return Sysfs(tmp_path)


def test_pci_function_of_pf_and_vfs(sysfs: Sysfs) -> None:
    pf = sysfs.pci_function(MLX5_PF)
    assert pf is not None
    assert (pf.driver, pf.numvfs, pf.totalvfs, pf.drivers_autoprobe) == ("mlx5_core", 4, 8, True)
    assert pf.netdevs == ("ibp59s0",) and pf.ib_devices == ("mlx5_0",)
    assert sysfs.virtfns(MLX5_PF) == dict(enumerate(MLX5_VFS))
    vf1 = sysfs.pci_function(MLX5_VFS[1])
    assert vf1 is not None and vf1.driver == "vfio-pci" and vf1.iommu_group == "61"
    assert vf1.physfn == MLX5_PF and vf1.driver_override is None
    assert sysfs.pci_function("0000:99:00.0") is None
    assert set(sysfs.sriov_pfs()) == {MLX5_PF, IGB_PF}


def test_netdevs_ib_and_modules(sysfs: Sysfs) -> None:
    assert sysfs.netdev_pci("eth0") == "0000:00:03.0"
    assert sysfs.netdev_pci("lo") is None
    assert sysfs.ib_driver("mlx5_0") == "mlx5_core"
    assert sysfs.ib_port_netdevs("mlx5_0") == ["ibp59s0"]
    assert sysfs.ib_vf("mlx5_0", 0) == {
        "node_guid": "00:00:00:00:00:00:00:00",
        "port_guid": "00:00:00:00:00:00:00:00",
        "policy": "Follow",
    }
    assert sysfs.ib_vf("mlx5_0", 9) is None
    assert "rdma_rxe" in sysfs.loaded_modules() and not sysfs.modules_disabled()
    assert "iommu=pt" in sysfs.cmdline()


def test_reads_of_missing_or_odd_files_are_none(sysfs: Sysfs, tmp_path: Path) -> None:
    assert sysfs.read("sys/nope") is None
    assert sysfs.read(f"{PCI_DEVICES}/{IGB_PF}/sriov_numvfs/x") is None  # ENOTDIR
    assert sysfs.read(DEV) is None  # EISDIR
    (tmp_path / "junk").write_text("not a number\n")
    assert sysfs.read_int("junk") is None
    assert sysfs.read_int(f"{PCI_DEVICES}/{IGB_PF}/sriov_totalvfs") == 7


def test_write_replaces_the_value_and_never_creates(sysfs: Sysfs, tmp_path: Path) -> None:
    sysfs.write(f"{sysfs.ib_vf_dir('mlx5_0', 0)}/policy", "Up")
    assert sysfs.read(f"{DEV}/{MLX5_PF}/sriov/0/policy") == "Up"  # not "Upllow"
    with pytest.raises(KernelError) as info:
        sysfs.write(
            f"{sysfs.device_dir('0000:99:00.0')}/sriov_numvfs", "2", op="set sriov_numvfs 2"
        )
    assert info.value.errno == errno.ENOENT
    assert not (tmp_path / PCI_DEVICES / "0000:99:00.0").exists()
    assert str(info.value) == (
        f"set sriov_numvfs 2 on {PCI_DEVICES}/0000:99:00.0/sriov_numvfs: "
        "no such file or device (ENOENT)"
    )


def test_write_to_a_directory_reports_eisdir_once(sysfs: Sysfs) -> None:
    with pytest.raises(KernelError) as info:
        sysfs.write(DEV, "1", op="poke")
    assert str(info.value) == f"poke on {DEV}: Is a directory (EISDIR)"


def test_rxe_port_state_and_gids(tmp_path: Path) -> None:
    """What rdmad reads to tell whether an rxe link can serve: the port's state and the
    valid GIDs, found at the lowest indexes (ib_core fills the lowest free entry)."""
    zero = "0000:0000:0000:0000:0000:0000:0000:0000"
    port = tmp_path / "sys/class/infiniband/rxe0/ports/1"
    (port / "gids").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    table = [
        "fe80:0000:0000:0000:5054:00ff:fe12:3456",
        zero,
        "0000:0000:0000:0000:0000:ffff:0a4d:0001",
    ]
    for index in range(1024):
        value = table[index] if index < len(table) else zero
        (port / "gids" / str(index)).write_text(value + "\n")
    sysfs = Sysfs(tmp_path)
    assert sysfs.ib_port_state("rxe0") == "ACTIVE"
    assert sysfs.ib_gids("rxe0") == (table[0], table[2])  # a freed entry in between
    (port / "state").write_text("1: DOWN\n")
    assert sysfs.ib_port_state("rxe0") == "DOWN"
    # A GID beyond the first entries read (many deleted, none added since) is not seen.
    (port / "gids" / "40").write_text("fd00:0000:0000:0000:0000:0000:0000:0001\n")
    assert sysfs.ib_gids("rxe0", limit=32) == (table[0], table[2])
    assert sysfs.ib_gids("mlx9") is None and sysfs.ib_port_state("mlx9") is None


# --- reads a safety decision rests on (issue #59: nothing pinned these) -----------------------


def test_a_missing_directory_is_unknown_unless_its_absence_means_none(tmp_path: Path) -> None:
    files = SysfsFiles(tmp_path)
    with pytest.raises(Unreadable, match="cannot list /proc"):
        files.entries("proc")  # no /proc is not "no process"
    assert files.entries("run/libvirt/qemu", optional=True) == []  # no libvirt: none


def test_a_link_that_cannot_be_read_is_unknown_not_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = SysfsFiles(tmp_path)
    assert files.link_known("sys/bus/pci/devices/0000:01:10.0/driver") is None  # not there
    FailAt(monkeypatch, tmp_path).fail(
        "sys/bus/pci/devices/0000:01:10.0/driver", errno.EACCES, "readlink"
    )
    with pytest.raises(Unreadable, match="Permission denied"):
        files.link_known("sys/bus/pci/devices/0000:01:10.0/driver")
