"""A read that fails is "unknown" (= in use, the reason named), never "nothing there".

Each listing or read that usage, the apply-time re-check and the guard rest on is made
to fail with EMFILE (every descriptor taken by a flood), EACCES and EIO
(``tests.support.failinject``), on fake trees where it is the only evidence of a
holder. Before the fix each of these read as "free": a VM's VF was destroyed by
``sriov_numvfs 1 -> 0`` and the guard let its PF driver go.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from rdmad.guard import cli, decide
from rdmad.kernel.apply.host import KernelHost
from rdmad.kernel.apply.observe import observe
from rdmad.kernel.apply.results import Outcome
from rdmad.kernel.errors import KernelError
from rdmad.kernel.pause import write_pause
from rdmad.kernel.sysfs import PCI_DEVICES, Sysfs
from rdmad.kernel.usage.holders import OpenFiles, vf_usage, vf_usage_now
from rdmad.model import (
    Action,
    Blocked,
    Desired,
    Observed,
    PlanState,
    RdmaLinkObserved,
    SetNumVfs,
    Use,
)
from rdmad.model.validation import validate
from rdmad.reconcile import plan
from tests.kernel.test_host import FakeRdma
from tests.support.failinject import FailAt
from tests.support.fakesysfs import FakeSysfs

PF = "0000:01:00.0"
VF = "0000:01:10.0"
QEMU = 5150
ERRNOS = [errno.EMFILE, errno.EACCES, errno.EIO]
HOSTDEV = (
    "<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' "
    "bus='0x01' slot='0x10' function='0x0'/></source></hostdev>"
)
LIBVIRT = "run/libvirt/qemu"


def words(code: int) -> str:
    return os.strerror(code)


def vm_node(root: Path, *, libvirt: bool = True, qemu: bool = True) -> FakeSysfs:
    """An igb PF with one VF passed to a VM: bound to vfio-pci (group 70), /dev/vfio/70
    open in QEMU, the VF a hostdev of libvirt domain vm1 (the issue's node)."""
    fs = FakeSysfs(root)
    fs.pf(PF, "igb", totalvfs=7, numvfs=1)
    fs.driver_module("igb", "igb")
    fs.netdev("enp1s0", PF, "52:54:00:12:34:56")
    fs.vf(PF, 0, VF, "vfio-pci", iommu_group=70)
    fs.module("vfio_pci")
    fs.process(1, "systemd", "/dev/null")
    if qemu:
        fs.process(QEMU, "qemu-system-x86", "/dev/vfio/70", "/dev/kvm")
    if libvirt:
        fs.libvirt_domain("vm1", HOSTDEV)
    (root / LIBVIRT).mkdir(parents=True, exist_ok=True)
    return fs


def numvfs(n: int) -> Desired:
    return validate(Desired, {"sriov": [{"pf": {"pci": PF}, "numvfs": n}]})


def sriov_actions(observed: Observed) -> list[Action]:
    """What the planner does for the PF declared with numvfs 0 (the guard hook aside)."""
    return [a for a in plan(numvfs(0), observed, PlanState()) if a.obj == f"sriov pci={PF}"]


def vf_usage_of(root: Path) -> tuple[Use, str]:
    sysfs = Sysfs(root)
    usage = vf_usage_now(sysfs, VF)
    return usage.state, usage.describe()


# --- usage: each listing alone is the only evidence of a holder ------------------------------


@pytest.mark.parametrize("code", ERRNOS)
def test_vm_vf_never_reads_free_when_proc_and_libvirt_cannot_be_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """The issue: QEMU holds /dev/vfio/70 and libvirt lists the VF; both listings fail."""
    vm_node(tmp_path)
    assert vf_usage_of(tmp_path)[0] is Use.IN_USE  # control: seen when it can look
    fail = FailAt(monkeypatch, tmp_path)
    fail.fail("proc", code)
    fail.fail(LIBVIRT, code)
    state, text = vf_usage_of(tmp_path)
    assert state is Use.UNKNOWN
    assert f"cannot list /proc: {words(code)}" in text
    assert f"cannot list /{LIBVIRT}: {words(code)}" in text
    # The observation the planner gets says the same, and so the planner refuses.
    observed = observe(Sysfs(tmp_path))
    [vf] = observed.pfs[0].vfs
    assert vf.usage.state is Use.UNKNOWN and f"cannot list /proc: {words(code)}" in (
        vf.usage.describe()
    )
    assert f"cannot list /proc: {words(code)}" in observed.notes
    [blocked] = sriov_actions(observed)
    assert isinstance(blocked, Blocked)
    assert "would destroy VFs in use" in blocked.reason
    assert f"cannot list /proc: {words(code)}" in blocked.reason


@pytest.mark.parametrize("code", ERRNOS)
@pytest.mark.parametrize("link", ["driver", "iommu_group"])
def test_an_unreadable_link_of_the_vf_makes_it_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, link: str
) -> None:
    """Which driver has the VF, which group QEMU would hold: readlink failing is not
    "unbound" or "no group"."""
    vm_node(tmp_path, qemu=False, libvirt=False)  # nothing else names a holder
    assert vf_usage_of(tmp_path)[0] is Use.FREE  # control: free when it can be read
    FailAt(monkeypatch, tmp_path).fail(f"{PCI_DEVICES}/{VF}/{link}", code, "readlink")
    state, why = vf_usage_of(tmp_path)
    assert state is Use.UNKNOWN
    assert f"cannot read the link /{PCI_DEVICES}/{VF}/{link}: {words(code)}" in why


@pytest.mark.parametrize("code", ERRNOS)
def test_unlistable_proc_alone_makes_a_vfio_vf_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    vm_node(tmp_path, libvirt=False)
    FailAt(monkeypatch, tmp_path).fail("proc", code)
    files = OpenFiles.scan(Sysfs(tmp_path))
    unknown = files.unknown()
    assert unknown is not None and unknown.state is Use.UNKNOWN
    assert unknown.holders == (
        f"cannot list /proc: {words(code)}: no process's open files were read",
    )
    assert vf_usage_of(tmp_path) == (Use.UNKNOWN, unknown.holders[0])


@pytest.mark.parametrize("code", ERRNOS)
def test_unlistable_libvirt_status_alone_makes_a_vf_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    vm_node(tmp_path, qemu=False)  # the domain is starting: listed, not opened yet
    assert vf_usage_of(tmp_path)[0] is Use.IN_USE
    FailAt(monkeypatch, tmp_path).fail(LIBVIRT, code)
    assert vf_usage_of(tmp_path) == (
        Use.UNKNOWN,
        f"cannot list /{LIBVIRT}: {words(code)}: libvirt's domains are unknown",
    )


def test_no_libvirt_directory_is_no_domain(tmp_path: Path) -> None:
    """ENOENT of an optional directory is legitimately nothing: no libvirt on the node."""
    vm_node(tmp_path, qemu=False, libvirt=False)
    (tmp_path / LIBVIRT).rmdir()
    assert vf_usage_of(tmp_path) == (Use.FREE, "free")


@pytest.mark.parametrize("code", ERRNOS)
def test_unlistable_iommufd_cdevs_make_a_vfio_vf_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    fs = vm_node(tmp_path, qemu=False, libvirt=False)
    node = fs.vfio_cdev(VF, 0)
    fs.process(QEMU, "qemu-system-x86", node)  # held through iommufd's cdev only
    assert vf_usage_of(tmp_path)[0] is Use.IN_USE
    FailAt(monkeypatch, tmp_path).fail(f"{PCI_DEVICES}/{VF}/vfio-dev", code)
    assert vf_usage_of(tmp_path) == (
        Use.UNKNOWN,
        f"cannot list /{PCI_DEVICES}/{VF}/vfio-dev: {words(code)}",
    )


def rdma_vf_node(root: Path) -> FakeSysfs:
    """A VF on mlx5_core with its netdev and RDMA device mlx5_4, uverbs9 open in a job."""
    fs = FakeSysfs(root)
    fs.pf(PF, "mlx5_core", totalvfs=8, numvfs=1)
    fs.vf(PF, 0, VF, "mlx5_core", iommu_group=70)
    fs.netdev("enp1s0v0", VF, "02:00:00:00:00:01")
    fs.ib_device("mlx5_4", VF, "00:00:00:00:00:00:00:04", netdev="enp1s0v0")
    fs.process(777, "ib_write_bw", fs.uverbs(9, "mlx5_4"))
    return fs


@pytest.mark.parametrize("code", ERRNOS)
@pytest.mark.parametrize(
    "rel",
    [f"{PCI_DEVICES}/{VF}/infiniband", "sys/class/infiniband_verbs"],
    ids=["vf-rdma-devices", "uverbs-nodes"],
)
def test_unlistable_rdma_device_or_uverbs_nodes_make_the_vf_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, rel: str
) -> None:
    rdma_vf_node(tmp_path)
    assert vf_usage_of(tmp_path)[0] is Use.IN_USE
    FailAt(monkeypatch, tmp_path).fail(rel, code)
    state, text = vf_usage_of(tmp_path)
    assert state is Use.UNKNOWN and f"cannot list /{rel}: {words(code)}" in text


@pytest.mark.parametrize("code", ERRNOS)
def test_unreadable_uverbs_owner_makes_the_vf_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    rdma_vf_node(tmp_path)
    rel = "sys/class/infiniband_verbs/uverbs9/ibdev"
    FailAt(monkeypatch, tmp_path).fail(rel, code, "open")
    assert vf_usage_of(tmp_path) == (Use.UNKNOWN, f"cannot read /{rel}: {words(code)}")


@pytest.mark.parametrize("code", ERRNOS)
def test_unlistable_vf_netdevs_name_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """Without its net/ listing the VF would look moved to another namespace: say why."""
    rdma_vf_node(tmp_path)
    FailAt(monkeypatch, tmp_path).fail(f"{PCI_DEVICES}/{VF}/net", code)
    state, text = vf_usage_of(tmp_path)
    assert state is not Use.FREE
    assert f"cannot list /{PCI_DEVICES}/{VF}/net: {words(code)}" in text


@pytest.mark.parametrize("code", ERRNOS)
def test_unlistable_rdma_devices_make_every_vf_unknown_in_the_observation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """An rxe link on the VF's netdev holds it; with the RDMA devices unlisted, nobody
    can tell whether one does."""
    fs = FakeSysfs(tmp_path)
    fs.pf(PF, "igb", totalvfs=7, numvfs=1)
    fs.vf(PF, 0, VF, "igbvf", iommu_group=70)
    fs.netdev("enp1s0v0", VF, "02:00:00:00:00:01")
    fs.ib_device("rxe0", None, "02:00:00:ff:fe:00:00:01", netdev="enp1s0v0")
    [vf] = observe(Sysfs(tmp_path)).pfs[0].vfs
    assert "enp1s0v0 carries rxe link rxe0" in vf.usage.describe()  # control
    FailAt(monkeypatch, tmp_path).fail("sys/class/infiniband", code)
    observed = observe(Sysfs(tmp_path))
    [vf] = observed.pfs[0].vfs
    assert vf.usage.state is Use.UNKNOWN
    assert f"cannot list /sys/class/infiniband: {words(code)}" in vf.usage.describe()


@pytest.mark.parametrize("code", ERRNOS)
@pytest.mark.parametrize("unlisted", [PCI_DEVICES, "sys/class/infiniband"])
def test_an_unlisted_device_class_is_not_nothing_to_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, unlisted: str
) -> None:
    """A node whose only RDMA link (read over RDMA netlink) is held by a verbs user: with
    the PCI devices or the RDMA devices unlisted, /proc is still read (an rxe link held
    must not read free) and the failure is said."""
    fs = FakeSysfs(tmp_path)
    fs.pci("0000:00:03.0", "virtio-pci")
    fs.netdev("eth0", None, "52:54:00:00:00:01")
    fs.ib_device("rxe0", None, "52:54:00:ff:fe:00:00:01", netdev="eth0")
    fs.process(4321, "ib_write_bw", fs.uverbs(0, "rxe0"))
    link = RdmaLinkObserved(name="rxe0", driver="rxe", netdev="eth0")
    FailAt(monkeypatch, tmp_path).fail(unlisted, code)
    observed = observe(Sysfs(tmp_path), rdma=[link])
    [seen] = observed.rdma_links
    assert seen.usage.state is Use.IN_USE, seen.usage
    assert "pid 4321 (ib_write_bw)" in seen.usage.describe()
    assert f"cannot list /{unlisted}: {words(code)}" in observed.notes


@pytest.mark.parametrize("code", ERRNOS)
def test_an_unreadable_autoprobe_is_unknown_not_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    fs = FakeSysfs(tmp_path)
    fs.pf(PF, "igb", totalvfs=7, numvfs=0)
    fs.write(f"sys/devices/pci0000:00/{PF}/sriov_drivers_autoprobe", "1")
    assert observe(Sysfs(tmp_path)).pfs[0].drivers_autoprobe is True  # control
    FailAt(monkeypatch, tmp_path).fail(f"{PCI_DEVICES}/{PF}/sriov_drivers_autoprobe", code, "open")
    [pf] = observe(Sysfs(tmp_path)).pfs
    assert pf.autoprobe_unread == (
        f"cannot read /{PCI_DEVICES}/{PF}/sriov_drivers_autoprobe: {words(code)}"
    )
    declared = validate(Desired, {"sriov": [{"pf": {"pci": PF}, "numvfs": 2, "autoprobe": False}]})
    actions = plan(declared, observe(Sysfs(tmp_path)), PlanState())
    assert not any(isinstance(a, SetNumVfs) for a in actions), actions


@pytest.mark.parametrize("code", ERRNOS)
def test_unlistable_vfs_of_a_pf_are_unknown_and_block_numvfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    vm_node(tmp_path)
    FailAt(monkeypatch, tmp_path).fail(f"{PCI_DEVICES}/{PF}", code)
    observed = observe(Sysfs(tmp_path))
    [vf] = observed.pfs[0].vfs
    reason = f"cannot list /{PCI_DEVICES}/{PF}: {words(code)}"
    assert (vf.index, vf.usage.state, vf.usage.holders) == (0, Use.UNKNOWN, (reason,))
    [blocked] = sriov_actions(observed)
    assert isinstance(blocked, Blocked) and reason in blocked.reason


@pytest.mark.parametrize("code", ERRNOS)
def test_a_process_whose_fds_cannot_be_listed_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    vm_node(tmp_path, libvirt=False)
    FailAt(monkeypatch, tmp_path).fail(f"proc/{QEMU}/fd", code)
    assert vf_usage_of(tmp_path) == (
        Use.UNKNOWN,
        f"open files of pid {QEMU} (qemu-system-x86) could not be read",
    )


def test_a_process_that_exits_during_the_scan_is_simply_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOENT of /proc/PID/fd: the process exited meanwhile, it holds nothing."""
    vm_node(tmp_path, libvirt=False)
    FailAt(monkeypatch, tmp_path).fail(f"proc/{QEMU}/fd", errno.ENOENT)
    assert vf_usage_of(tmp_path) == (Use.FREE, "free")


# --- the apply-time re-check -------------------------------------------------------------------


@pytest.mark.parametrize("code", ERRNOS)
@pytest.mark.parametrize(
    "failing",
    [("proc", LIBVIRT), (f"{PCI_DEVICES}/{PF}",)],
    ids=["proc-and-libvirt", "pf-vf-list"],
)
async def test_recheck_refuses_numvfs_1_to_0_naming_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, failing: tuple[str, ...]
) -> None:
    """Planned while the VF looked free; at the write the kernel cannot be read."""
    vm_node(tmp_path, qemu=False, libvirt=False)
    host = KernelHost(tmp_path)
    action = SetNumVfs(f"sriov pci={PF}", "declared numvfs is 0 (was 1)", pci=PF, old=1, new=0)
    # The VM starts after the plan, while /proc (and libvirt's directory) cannot be listed.
    fs = FakeSysfs(tmp_path)
    fs.process(QEMU, "qemu-system-x86", "/dev/vfio/70")
    fs.libvirt_domain("vm1", HOSTDEV)
    fail = FailAt(monkeypatch, tmp_path)
    for rel in failing:
        fail.fail(rel, code)
    result = await host.apply(action)
    assert result.outcome is Outcome.STALE, result.describe()
    assert f"cannot list /{failing[0]}: {words(code)}" in result.note
    assert (tmp_path / PCI_DEVICES / PF / "sriov_numvfs").read_text().strip() == "1"
    assert not host.records  # nothing written


@pytest.mark.parametrize("code", ERRNOS)
async def test_recheck_refuses_numvfs_when_the_count_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    vm_node(tmp_path, qemu=False, libvirt=False)
    host = KernelHost(tmp_path)
    rel = f"{PCI_DEVICES}/{PF}/sriov_numvfs"
    FailAt(monkeypatch, tmp_path).fail(rel, code, "open")
    result = await host.apply(SetNumVfs("o", "r", pci=PF, old=1, new=0))
    assert result.stale and f"cannot read /{rel}: {words(code)}" in result.note


# --- the guard -----------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ERRNOS)
@pytest.mark.parametrize(
    "failing",
    [("proc", LIBVIRT), (f"{PCI_DEVICES}/{PF}",), ("sys/bus/pci/drivers/igb",)],
    ids=["proc-and-libvirt", "pf-vf-list", "driver-devices"],
)
def test_guard_refuses_an_unload_it_cannot_check_naming_why(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    code: int,
    failing: tuple[str, ...],
) -> None:
    vm_node(tmp_path)
    root = str(tmp_path)
    assert cli.main(["check", "igb"], root=root) == cli.EXIT_REFUSED  # control: QEMU, vm1
    capsys.readouterr()
    fail = FailAt(monkeypatch, tmp_path)
    for rel in failing:
        fail.fail(rel, code)
    reason = f"cannot list /{failing[0]}: {words(code)}"
    d = decide.decide(Sysfs(tmp_path), "igb", [])
    assert not d.allowed and reason in d.explain()
    assert cli.main(["check", "igb"], root=root) == cli.EXIT_REFUSED
    err = capsys.readouterr().err
    assert "refused, in use" in err and reason in err


@pytest.mark.parametrize("code", ERRNOS)
def test_guard_refuses_a_pf_driver_when_the_rdma_devices_cannot_be_listed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    code: int,
) -> None:
    """The VF's netdev carries an rxe link (its only holder); the links cannot be listed."""
    fs = FakeSysfs(tmp_path)
    fs.pf(PF, "igb", totalvfs=7, numvfs=1)
    fs.driver_module("igb", "igb")
    fs.vf(PF, 0, VF, "igbvf", iommu_group=70)
    fs.netdev("enp1s0v0", VF, "02:00:00:00:00:01")
    fs.module("ib_core")
    fs.ib_device("rxe0", None, "02:00:00:ff:fe:00:00:01", netdev="enp1s0v0")
    root = str(tmp_path)
    assert cli.main(["check", "igb"], root=root) == cli.EXIT_REFUSED  # control: rxe0
    assert "enp1s0v0 carries rxe link rxe0" in capsys.readouterr().err
    FailAt(monkeypatch, tmp_path).fail("sys/class/infiniband", code)
    assert cli.main(["check", "igb"], root=root) == cli.EXIT_REFUSED
    err = capsys.readouterr().err
    assert "refused, in use" in err
    assert f"cannot list /sys/class/infiniband: {words(code)}" in err


@pytest.mark.parametrize("code", ERRNOS)
def test_guard_refuses_rdma_rxe_when_the_rdma_devices_cannot_be_listed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    code: int,
) -> None:
    fs = FakeSysfs(tmp_path)
    fs.module("ib_core")
    fs.module("rdma_rxe")
    fs.netdev("eth0", None, "52:54:00:ab:cd:ef")
    fs.ib_device("rxe0", None, "52:54:00:ff:fe:ab:cd:ef", netdev="eth0")
    fs.process(777, "ib_write_bw", fs.uverbs(0, "rxe0"))
    root = str(tmp_path)
    assert cli.main(["check", "rdma_rxe"], root=root) == cli.EXIT_REFUSED  # control
    capsys.readouterr()
    FailAt(monkeypatch, tmp_path).fail("sys/class/infiniband", code)
    assert cli.main(["check", "rdma_rxe"], root=root) == cli.EXIT_REFUSED
    assert f"cannot list /sys/class/infiniband: {words(code)}" in capsys.readouterr().err


def test_vf_usage_of_an_unreadable_vf_directory_is_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A VF is "gone" (so free) only when the kernel says ENOENT, not when the lookup failed."""
    vm_node(tmp_path, qemu=False, libvirt=False)
    FailAt(monkeypatch, tmp_path).fail(f"{PCI_DEVICES}/{VF}", errno.EIO, "lstat")
    sysfs = Sysfs(tmp_path)
    usage = vf_usage(sysfs, OpenFiles.scan(sysfs), {}, VF, [RdmaLinkObserved("x", None, None)])
    assert usage.state is Use.UNKNOWN
    assert usage.holders == (f"cannot look up /{PCI_DEVICES}/{VF}: {words(errno.EIO)}",)


# --- RDMA netlink not read: the kernel users of RDMA devices are unknown -----------------------


class BrokenRdma(FakeRdma):
    """RDMA netlink that answers the probe, then fails to list (ENOBUFS, EMFILE...)."""

    def __init__(self, code: int) -> None:
        super().__init__()
        self.code = code

    async def links(self) -> list[RdmaLinkObserved]:
        raise KernelError("list RDMA devices", "", self.code)


@pytest.mark.parametrize("code", ERRNOS)
async def test_rdma_links_read_from_sysfs_after_a_netlink_failure_count_as_in_use(
    tmp_path: Path, code: int
) -> None:
    """Kernel users (NFS over RDMA, iSER) hold no file: only RDMA netlink shows them. When
    it fails, the VF's RDMA device is not "free" for lack of a uverbs holder."""
    fs = rdma_vf_node(tmp_path)
    (tmp_path / "proc/777").rename(tmp_path / "proc/gone")  # no user-space holder at all
    fs.module("ib_core")
    host = KernelHost(tmp_path, rdma=BrokenRdma(code))
    [vf] = (await host.observe()).pfs[0].vfs
    assert vf.usage.state is Use.UNKNOWN
    assert "kernel users unknown: RDMA netlink could not be read: list RDMA devices" in (
        vf.usage.describe()
    )
    # and the re-check before a numvfs write, which reads the links again, refuses
    result = await host.apply(SetNumVfs("o", "r", pci=PF, old=1, new=0))
    assert result.stale and "kernel users unknown" in result.note
    assert (tmp_path / PCI_DEVICES / PF / "sriov_numvfs").read_text().strip() == "1"


async def test_rdma_links_read_from_sysfs_during_a_guarded_stop_count_as_in_use(
    tmp_path: Path,
) -> None:
    """While a guarded stop runs rdmad opens no RDMA netlink socket (it could load ib_core
    again): the kernel users it did not read are unknown, not none."""
    fs = rdma_vf_node(tmp_path)
    (tmp_path / "proc/777").rename(tmp_path / "proc/gone")
    fs.module("ib_core")
    write_pause(
        Sysfs(tmp_path), by="a test", reason="stack stop", seconds=60, modules=[], now=time.time()
    )
    [vf] = (await KernelHost(tmp_path, rdma=FakeRdma()).observe()).pfs[0].vfs
    assert vf.usage.state is Use.UNKNOWN
    assert "RDMA netlink is not read while a guarded stop is in progress" in vf.usage.describe()
