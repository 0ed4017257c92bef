"""KernelHost.apply() of every action kind, and observe(), on fake sysfs trees.

A fake sysfs file just stores what is written, so error paths use real errnos:
the target is a directory (EISDIR), missing (ENOENT), or a FIFO nobody reads (a
write that never returns). Binding is emulated by ``KernelishSysfs``, which does
what the kernel does on driver_override/unbind/drivers_probe writes.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from rdmad.kernel.apply import host as host_mod
from rdmad.kernel.apply import slowwrite
from rdmad.kernel.apply.dryrun import RecordingHost
from rdmad.kernel.apply.host import KernelHost
from rdmad.kernel.apply.results import RECORDS_KEPT, Outcome
from rdmad.kernel.errors import KernelError
from rdmad.kernel.ibcore import OPTIONS_FILE
from rdmad.kernel.netlink.nlcodec import asciiz, attr, nested
from rdmad.kernel.netlink.rtnetlink import RtNetlink
from rdmad.kernel.netlink.rtnl_codec import (
    IFF_UP,
    IFINFO,
    IFLA_ADDRESS,
    IFLA_IFNAME,
    IFLA_INFO_KIND,
    IFLA_LINKINFO,
    LinkInfo,
)
from rdmad.kernel.netlink.vf_apply import VfChangeResult
from rdmad.kernel.pause import PAUSE_FILE, write_pause
from rdmad.kernel.sysfs import PCI_DEVICES, Sysfs
from rdmad.model import (
    Action,
    AddRxe,
    BindVfDriver,
    Blocked,
    DeleteRxe,
    LoadModule,
    RdmaLinkObserved,
    SetAutoprobe,
    SetIbVf,
    SetLinkUp,
    SetNumVfs,
    SetRdmaNetnsMode,
    SetVfSettings,
    SyncIbCoreOptions,
    VfChange,
    VfSettings,
    Waiting,
)
from tests.support.countingsysfs import CountingSysfs
from tests.support.fakesysfs import DEV, IGB_PF, MLX5_PF, MLX5_VFS, FakeSysfs, mlx5_node
from tests.support.netns import owned_netns

IGB_NUMVFS = f"{PCI_DEVICES}/{IGB_PF}/sriov_numvfs"
DEADLINE = 10.0


class KernelishSysfs(Sysfs):
    """A fake tree that binds and unbinds like the kernel does on those writes."""

    def write(self, rel: str, value: str, *, op: str | None = None) -> None:
        super().write(rel, value, op=op)
        pci = value.strip()
        if rel.endswith("/unbind"):
            link = Path(self.path(f"{DEV}/{pci}/driver"))
            if link.is_symlink():
                link.unlink()
        elif rel == "sys/bus/pci/drivers_probe":
            override = self.read(f"{PCI_DEVICES}/{pci}/driver_override")
            driver = override if override not in (None, "", "(null)") else "mlx5_core"
            if self.exists(f"sys/bus/pci/drivers/{driver}"):
                os.symlink(f"../../../bus/pci/drivers/{driver}", self.path(f"{DEV}/{pci}/driver"))


class FakeRtnl:
    def __init__(self, links: list[LinkInfo], refuse: Mapping[str, int] | None = None) -> None:
        self._links = links
        self.refuse = dict(refuse or {})
        self.calls: list[tuple[int | str, list[VfChange], Mapping[int, VfSettings]]] = []

    async def links(self, vfs: bool = True) -> list[LinkInfo]:
        return list(self._links)

    async def set_vf_settings(
        self, link: int | str, changes: Sequence[VfChange], current: Mapping[int, VfSettings]
    ) -> list[VfChangeResult]:
        self.calls.append((link, list(changes), current))
        return [
            VfChangeResult(
                c,
                KernelError(f"set vf {c.vf} {c.attr}", str(link), self.refuse[c.attr])
                if c.attr in self.refuse
                else None,
            )
            for c in changes
        ]

    async def set_up(self, link: int | str) -> None:
        if "up" in self.refuse:
            raise KernelError(f"set {link} up", "", self.refuse["up"])
        self.calls.append((link, [], {}))

    def close(self) -> None:
        pass


class FakeRdma:
    def __init__(self, ok: bool = True, fail: KernelError | None = None) -> None:
        self.ok = ok
        self.fail = fail
        self.reason: str | None = None if ok else "the kernel has no RDMA netlink (NETLINK_RDMA)"
        self.lasting = True
        self.made: dict[str, str] = {}
        self.probes = 0
        self.transient = 0  # this many probes fail as out of descriptors first
        self.netns_modes: list[str] = []  # set_netns_mode calls, in order

    def available(self) -> bool:
        self.probes += 1
        if self.transient:
            self.transient -= 1
            self.reason = "cannot open an RDMA netlink socket: Too many open files"
            self.lasting = False
            return False
        self.reason, self.lasting = (None, True) if self.ok else (self.reason, True)
        return self.ok

    async def links(self) -> list[RdmaLinkObserved]:
        return [RdmaLinkObserved(n, None, d) for n, d in self.made.items()]

    async def add_link(self, name: str, link_type: str, netdev: str) -> None:
        if self.fail:
            raise self.fail
        self.made[name] = netdev

    async def delete_link(self, name: str) -> None:
        if self.fail:
            raise self.fail
        del self.made[name]

    async def set_netns_mode(self, mode: str) -> None:
        if self.fail:
            raise self.fail
        self.netns_modes.append(mode)

    def close(self) -> None:
        pass


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    mlx5_node(tmp_path)
    return tmp_path


def make_host(root: Path, **kw: object) -> KernelHost:
    host = KernelHost(root, **kw)  # type: ignore[arg-type]
    host.sysfs = KernelishSysfs(root)
    return host


# --- SetNumVfs ----------------------------------------------------------------------------


async def test_set_numvfs_writes_logs_and_records(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    host = make_host(tree)
    action = SetNumVfs("sriov name=enp94s0f0", "restore 7 VFs", pci=IGB_PF, old=0, new=7)
    with caplog.at_level(logging.DEBUG, "rdmad.kernel"):
        result = await host.apply(action)
    assert result.outcome is Outcome.APPLIED and result.ok and not result.errors
    assert (tree / IGB_NUMVFS).read_text() == "7"
    [record] = host.records
    assert (record.target, record.old, record.new, record.reason) == (
        f"{IGB_PF} sriov_numvfs",
        0,
        7,
        "restore 7 VFs",
    )
    assert f"{IGB_PF} sriov_numvfs: 0 -> 7 (restore 7 VFs): ok" in caplog.text


async def test_set_numvfs_kernel_errors_reach_the_user(tree: Path) -> None:
    host = make_host(tree)
    target = tree / DEV / IGB_PF / "sriov_numvfs"
    target.unlink()
    target.mkdir()
    result = await host.apply(SetNumVfs("o", "r", pci=IGB_PF, old=0, new=7))
    assert result.outcome is Outcome.FAILED and not result.ok
    [error] = result.errors
    assert error.errno == errno.EISDIR
    assert str(error) == f"set sriov_numvfs 7 on {IGB_NUMVFS}: Is a directory (EISDIR)"
    gone = await host.apply(SetNumVfs("o", "r", pci="0000:99:00.0", old=0, new=2))
    assert gone.errors[0].errno == errno.ENOENT
    assert "no such file or device (ENOENT)" in str(gone.errors[0])
    assert len(host.records) == 2 and not any(r.ok for r in host.records)


async def test_a_long_lived_host_keeps_only_the_last_writes(tree: Path) -> None:
    # The daemon's host lives for months: its record of writes must not grow with them.
    host = make_host(tree)
    dry = RecordingHost(host.observe, Sysfs(tree))
    for n in range(RECORDS_KEPT + 40):
        action = SetNumVfs("o", f"write {n}", pci=IGB_PF, old=0, new=n % 8)
        await host.apply(action)
        await dry.apply(action)
    for records in (host.records, dry.records):
        assert len(records) == RECORDS_KEPT
        assert records[-1].reason == f"write {RECORDS_KEPT + 39}"  # the newest kept
        assert records[0].reason == "write 40"  # the oldest dropped


async def test_set_numvfs_read_back_mismatch_is_an_error(tree: Path) -> None:
    class Stubborn(KernelishSysfs):
        def write(self, rel: str, value: str, *, op: str | None = None) -> None:
            super().write(rel, "3" if rel.endswith("sriov_numvfs") else value, op=op)

    host = KernelHost(tree)
    host.sysfs = Stubborn(tree)
    result = await host.apply(SetNumVfs("o", "r", pci=IGB_PF, old=0, new=7))
    assert "the write returned but sriov_numvfs reads 3" in str(result.errors[0])


async def test_long_numvfs_write_logs_progress_and_hits_its_deadline(
    tree: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write the kernel does not finish in time: the loop stays free, the error says so."""
    release = threading.Event()

    class Slow(KernelishSysfs):
        def write(self, rel: str, value: str, *, op: str | None = None) -> None:
            release.wait(DEADLINE)
            super().write(rel, value, op=op)

    monkeypatch.setattr(slowwrite, "PROGRESS_EVERY", 0.05)
    host = KernelHost(tree, numvfs_deadline=0.3)
    host.sysfs = Slow(tree)
    try:
        with caplog.at_level(logging.INFO, "rdmad.kernel"):
            result = await host.apply(SetNumVfs("o", "r", pci=IGB_PF, old=0, new=7))
    finally:
        release.set()
    [error] = result.errors
    assert error.errno == errno.ETIMEDOUT
    assert "still running after 0.3 s" in str(error)
    assert "set sriov_numvfs 7 still in progress after" in caplog.text


async def test_no_second_write_while_one_past_its_deadline_still_runs(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel still has the first write: a retry must not start a second one to the
    same file (two numvfs writes racing in the driver), and the loop is never blocked."""
    release = threading.Event()
    writes: list[str] = []

    class Slow(KernelishSysfs):
        def write(self, rel: str, value: str, *, op: str | None = None) -> None:
            writes.append(value)
            release.wait(DEADLINE)
            super().write(rel, value, op=op)

    monkeypatch.setattr(slowwrite, "PROGRESS_EVERY", 0.05)
    host = KernelHost(tree, numvfs_deadline=0.2)
    host.sysfs = Slow(tree)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    beat = asyncio.ensure_future(ticker())
    try:
        first = await host.apply(SetNumVfs("o", "r", pci=IGB_PF, old=0, new=7))
        assert first.errors[0].errno == errno.ETIMEDOUT
        again = await host.apply(SetNumVfs("o", "r", pci=IGB_PF, old=0, new=7))
        [error] = again.errors
        assert error.errno == errno.EBUSY and "earlier write to this file" in str(error)
        assert writes == ["7"]  # the retry never reached the kernel
        assert ticks > 5  # the event loop ran while the write blocked
    finally:
        release.set()
        beat.cancel()
    for _ in range(500):  # the first write returns; then the file is free again
        if IGB_NUMVFS not in host.slow.running:
            break
        await asyncio.sleep(0.01)
    (tree / IGB_NUMVFS).write_text("0")
    third = await host.apply(SetNumVfs("o", "r", pci=IGB_PF, old=0, new=7))
    assert third.outcome is Outcome.APPLIED, third.describe()


async def test_numvfs_write_rechecks_count_and_usage_first(tree: Path) -> None:
    host = make_host(tree)
    (tree / IGB_NUMVFS).write_text("7")
    moved = await host.apply(SetNumVfs("o", "r", pci=IGB_PF, old=4, new=0))
    assert moved.stale and "sriov_numvfs is 7, planned from 4" in moved.note
    # The mlx5 PF's VF 1 is held by a VM (pid 4242) that started after the plan.
    numvfs = tree / DEV / MLX5_PF / "sriov_numvfs"
    count = int(numvfs.read_text())
    held = await host.apply(SetNumVfs("o", "r", pci=MLX5_PF, old=count, new=0))
    assert held.stale and "pid 4242 (qemu-system-x86)" in held.note
    assert int(numvfs.read_text()) == count and not host.records


def every_action() -> list[Action]:
    vf = VfChange(0, "mac", "00:00:00:00:00:00", "02:00:00:00:00:01")
    return [
        SetAutoprobe("o", "r", pci=IGB_PF, old=True, new=False),
        SetNumVfs("o", "r", pci=IGB_PF, old=0, new=7),
        SetVfSettings("o", "r", pci=IGB_PF, pf_netdev="enp94s0f0", pf_ifindex=3, changes=(vf,)),
        ib_action(rebind=True),
        BindVfDriver("o", "r", vf_pci=MLX5_VFS[3], old=None, new="vfio-pci"),
        BindVfDriver("o", "r", vf_pci=MLX5_VFS[2], old="mlx5_core", new="none"),
        LoadModule("o", "r", module="rdma_rxe"),
        AddRxe("o", "r", name="rxe0", netdev="eth0"),
        DeleteRxe("o", "r", name="rxe9", netdev="eth1"),
        SyncIbCoreOptions("o", "r", mode="exclusive", old=None),
        SetRdmaNetnsMode("o", "r", old="shared", new="exclusive"),
    ]


async def test_dry_run_records_exactly_what_apply_writes(tree: Path) -> None:
    ok = tree / "ok-modprobe"
    ok.write_text("#!/bin/sh\nexit 0\n")
    ok.chmod(0o755)
    rdma = FakeRdma()
    rdma.made["rxe9"] = "eth1"
    rtnl = FakeRtnl([pf_link({0: VfSettings(mac="00:00:00:00:00:00")})])
    real = make_host(tree, rtnl=rtnl, rdma=rdma, modprobe_program=str(ok))
    dry = RecordingHost(real.observe, Sysfs(tree))
    for action in every_action():
        recorded = await dry.apply(action)
        done = await real.apply(action)
        assert done.outcome is Outcome.APPLIED, done.describe()
        assert [(w.target, w.old, w.new) for w in recorded.writes] == [
            (w.target, w.old, w.new) for w in done.writes
        ], action.kind


# --- SetVfSettings ----------------------------------------------------------------------------


def pf_link(vfs: Mapping[int, VfSettings]) -> LinkInfo:
    return LinkInfo("enp94s0f0", 3, "52:54:00:12:34:56", None, True, "up", None, len(vfs), vfs)


async def test_set_vf_settings_reports_per_attribute(tree: Path) -> None:
    current = {0: VfSettings(mac="00:00:00:00:00:00", vlan=5, qos=1)}
    rtnl = FakeRtnl([pf_link(current)], refuse={"link_state": errno.EOPNOTSUPP})
    FakeSysfs(tree).vf(IGB_PF, 0, "0000:5e:10.0", "igbvf", iommu_group=70)
    host = make_host(tree, rtnl=rtnl)
    await host.observe()  # the snapshot the planner would have used
    changes = (
        VfChange(0, "mac", "00:00:00:00:00:00", "02:00:00:00:00:01"),
        VfChange(0, "link_state", "auto", "enable"),
    )
    action = SetVfSettings("o", "declared", pci=IGB_PF, pf_netdev="enp94s0f0", changes=changes)
    result = await host.apply(action)
    assert result.outcome is Outcome.PARTIAL and not result.ok
    [error] = result.errors
    assert str(error) == (
        "set vf 0 link_state on enp94s0f0: operation not supported by the driver (EOPNOTSUPP)"
    )
    assert [(w.target, w.ok) for w in result.writes] == [
        ("enp94s0f0 vf 0 mac", True),
        ("enp94s0f0 vf 0 link_state", False),
    ]
    [(link, sent, cur)] = rtnl.calls
    assert link == "enp94s0f0" and sent == list(changes) and cur[0].vlan == 5


async def test_set_link_up_goes_through_rtnetlink_and_reports_refusals(tree: Path) -> None:
    rtnl = FakeRtnl([pf_link({})])
    host = make_host(tree, rtnl=rtnl)
    result = await host.apply(SetLinkUp("o", "bnxt needs it", netdev="enp94s0f0"))
    assert result.ok and rtnl.calls == [("enp94s0f0", [], {})]
    assert [(w.target, w.old, w.new) for w in result.writes] == [("enp94s0f0 link", "down", "up")]
    refused = make_host(tree, rtnl=FakeRtnl([pf_link({})], refuse={"up": errno.EPERM}))
    result = await refused.apply(SetLinkUp("o", "bnxt needs it", netdev="enp94s0f0"))
    [error] = result.errors
    assert not result.ok and "set enp94s0f0 up" in str(error) and "EPERM" in str(error)


async def test_set_vf_settings_without_netlink_fails_clearly(tree: Path) -> None:
    host = make_host(tree)
    action = SetVfSettings(
        "o", "r", pci=IGB_PF, pf_netdev="enp94s0f0", changes=(VfChange(0, "trust", False, True),)
    )
    result = await host.apply(action)
    assert result.outcome is Outcome.FAILED
    assert "no rtnetlink here" in str(result.errors[0])


# --- SetIbVf --------------------------------------------------------------------------------------


def ib_action(rebind: bool) -> SetIbVf:
    return SetIbVf(
        "sriov pci=0000:3b:00.0",
        "declared GUIDs",
        pci=MLX5_PF,
        ib_device="mlx5_0",
        vf=0,
        vf_pci=MLX5_VFS[0],
        changes=(
            VfChange(0, "node_guid", "00:00:00:00:00:00:00:00", "00:11:22:33:44:55:66:77"),
            VfChange(0, "policy", "Follow", "Up"),
        ),
        rebind=rebind,
        vf_driver="mlx5_core",
    )


async def test_set_ib_vf_writes_guids_then_rebinds(tree: Path) -> None:
    host = make_host(tree)
    result = await host.apply(ib_action(rebind=True))
    assert result.outcome is Outcome.APPLIED, result.describe()
    base = tree / DEV / MLX5_PF / "sriov/0"
    assert (base / "node").read_text() == "00:11:22:33:44:55:66:77"
    assert (base / "policy").read_text() == "Up"
    assert [(w.target, w.old, w.new) for w in result.writes] == [
        ("mlx5_0 vf 0 node_guid", "00:00:00:00:00:00:00:00", "00:11:22:33:44:55:66:77"),
        ("mlx5_0 vf 0 policy", "Follow", "Up"),
        (f"{MLX5_VFS[0]} driver", "mlx5_core", None),
        (f"{MLX5_VFS[0]} driver", None, "mlx5_core"),
    ]
    assert (tree / "sys/bus/pci/drivers_probe").read_text() == MLX5_VFS[0]


async def test_set_ib_vf_failed_guid_write_skips_the_rebind(tree: Path) -> None:
    node = tree / DEV / MLX5_PF / "sriov/0/node"
    node.unlink()
    node.mkdir()
    host = make_host(tree)
    result = await host.apply(ib_action(rebind=True))
    assert result.outcome is Outcome.PARTIAL
    assert str(result.errors[0]) == (
        "set mlx5_0 vf 0 node_guid on sys/class/infiniband/mlx5_0/device/sriov/0/node: "
        "Is a directory (EISDIR)"
    )
    assert result.note.startswith("not done after a failed write: ")
    assert not any(w.target.endswith(" driver") for w in result.writes)


async def test_rebind_unbind_refused(tree: Path) -> None:
    unbind = tree / "sys/bus/pci/drivers/mlx5_core/unbind"
    unbind.unlink()
    unbind.mkdir()
    result = await make_host(tree).apply(ib_action(rebind=True))
    assert "unbind from mlx5_core" in str(result.errors[-1]) and "EISDIR" in str(result.errors[-1])


# --- BindVfDriver ------------------------------------------------------------------------------


async def test_bind_unbound_vf_to_vfio(tree: Path) -> None:
    host = make_host(tree)
    vf = MLX5_VFS[3]  # unbound in the demo tree
    result = await host.apply(BindVfDriver("o", "declared", vf_pci=vf, old=None, new="vfio-pci"))
    assert result.outcome is Outcome.APPLIED, result.describe()
    assert Sysfs(tree).link_name(f"{PCI_DEVICES}/{vf}/driver") == "vfio-pci"
    assert [(w.target, w.old, w.new) for w in result.writes] == [
        (f"{vf} driver_override", None, "vfio-pci"),
        (f"{vf} driver", None, "vfio-pci"),
    ]


async def test_rebind_from_vfio_to_mlx5(tree: Path) -> None:
    host = make_host(tree)
    vf = MLX5_VFS[1]
    (tree / "proc/4242").rename(tree / "proc/gone")  # the VM that held it has exited
    action = BindVfDriver("o", "r", vf_pci=vf, old="vfio-pci", new="mlx5_core", override_old=None)
    result = await host.apply(action)
    assert result.outcome is Outcome.APPLIED, result.describe()
    assert [(w.target, w.old, w.new) for w in result.writes] == [
        (f"{vf} driver_override", None, "mlx5_core"),
        (f"{vf} driver", "vfio-pci", None),
        (f"{vf} driver", None, "mlx5_core"),
    ]
    assert Sysfs(tree).link_name(f"{PCI_DEVICES}/{vf}/driver") == "mlx5_core"


async def test_rebind_of_a_vf_taken_since_the_plan_is_dropped_as_stale(tree: Path) -> None:
    # Planned while free; by the time the write runs a VM holds /dev/vfio/61 (pid 4242).
    host = make_host(tree)
    vf = MLX5_VFS[1]
    before = (tree / DEV / vf / "driver_override").read_text()
    action = BindVfDriver("o", "r", vf_pci=vf, old="vfio-pci", new="mlx5_core", override_old=None)
    result = await host.apply(action)
    assert result.outcome is Outcome.STALE and result.ok and result.writes == ()
    assert "pid 4242 (qemu-system-x86) holds /dev/vfio/61" in result.note
    assert Sysfs(tree).link_name(f"{PCI_DEVICES}/{vf}/driver") == "vfio-pci"
    assert (tree / DEV / vf / "driver_override").read_text() == before
    assert not host.records  # nothing was written, not even the override


async def test_rebind_of_a_vf_whose_driver_changed_is_stale(tree: Path) -> None:
    host = make_host(tree)
    vf = MLX5_VFS[0]  # bound to mlx5_core, planned as if bound to vfio-pci
    action = BindVfDriver("o", "r", vf_pci=vf, old="vfio-pci", new="igbvf", override_old=None)
    result = await host.apply(action)
    assert result.stale and "bound to mlx5_core, not vfio-pci" in result.note


async def test_bind_that_does_not_take_says_so(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_mod, "BIND_DEADLINE", 0.1)
    host = KernelHost(tree)  # plain fake tree: nothing binds
    result = await host.apply(BindVfDriver("o", "r", vf_pci=MLX5_VFS[3], old=None, new="vfio-pci"))
    assert result.outcome is Outcome.PARTIAL
    assert str(result.errors[0]) == (
        f"probe drivers on {MLX5_VFS[3]}: bound to no driver 0.1 s after drivers_probe, "
        "not vfio-pci (is vfio-pci loaded, and does it claim this device?)"
    )


async def test_bind_override_write_refused(tree: Path) -> None:
    path = tree / DEV / MLX5_VFS[3] / "driver_override"
    path.unlink()
    result = await make_host(tree).apply(
        BindVfDriver("o", "r", vf_pci=MLX5_VFS[3], old=None, new="vfio-pci")
    )
    assert result.outcome is Outcome.FAILED and len(result.writes) == 1
    assert str(result.errors[0]).startswith(f"set {MLX5_VFS[3]} driver_override on ")
    assert "(ENOENT)" in str(result.errors[0])


async def test_bind_loads_a_missing_driver_and_reports_modprobe(tree: Path) -> None:
    fake = tree / "fake-modprobe"
    fake.write_text("#!/bin/sh\necho 'modprobe: FATAL: Module vfio_pci not found.' >&2\nexit 1\n")
    fake.chmod(0o755)
    host = make_host(tree, modprobe_program=str(fake))
    bind = BindVfDriver("o", "r", vf_pci=MLX5_VFS[3], old=None, new="igbvf", load_module=True)
    result = await host.apply(bind)
    assert result.outcome is Outcome.FAILED
    assert result.note.startswith("not done after a failed write: ")
    assert str(result.errors[0]) == "modprobe igbvf: modprobe: FATAL: Module vfio_pci not found."


# --- LoadModule --------------------------------------------------------------------------------


async def test_load_module_ok_and_refused(tree: Path) -> None:
    ok = tree / "ok-modprobe"
    ok.write_text("#!/bin/sh\nexit 0\n")
    ok.chmod(0o755)
    host = make_host(tree, modprobe_program=str(ok))
    result = await host.apply(LoadModule("rxe rxe0", "rxe links need rdma_rxe", module="nvidia"))
    assert result.outcome is Outcome.APPLIED
    assert (result.writes[0].old, result.writes[0].new) == ("not loaded", "loaded")
    (tree / "proc/sys/kernel/modules_disabled").write_text("1\n")
    refused = await host.apply(LoadModule("o", "r", module="nvidia"))
    assert refused.outcome is Outcome.FAILED
    assert str(refused.errors[0]) == (
        "modprobe nvidia: operation not permitted (not root, or locked down) (EPERM); "
        "module loading is disabled until reboot (/proc/sys/kernel/modules_disabled = 1)"
    )


async def test_load_module_real_modprobe_missing_module(tree: Path) -> None:
    name = f"rdmad_nosuch_{uuid.uuid4().hex[:6]}"
    result = await make_host(tree).apply(LoadModule("o", "r", module=name))
    assert f"modprobe: FATAL: Module {name} not found" in str(result.errors[0])


# --- rxe ---------------------------------------------------------------------------


async def test_add_and_delete_rxe(tree: Path) -> None:
    rdma = FakeRdma()
    host = make_host(tree, rdma=rdma)
    added = await host.apply(AddRxe("rxe rxe0", "declared", name="rxe0", netdev="eth0"))
    assert added.outcome is Outcome.APPLIED and rdma.made == {"rxe0": "eth0"}
    observed = await host.observe()
    assert observed.rdma_link("rxe0") is not None
    deleted = await host.apply(
        DeleteRxe("rxe rxe0", "no longer declared", name="rxe0", netdev="eth0")
    )
    assert deleted.outcome is Outcome.APPLIED and rdma.made == {}
    assert (deleted.writes[0].old, deleted.writes[0].new) == ("rxe on eth0", None)


async def test_an_rxe_delete_under_a_verbs_user_since_the_plan_is_stale(tree: Path) -> None:
    # The plan saw rxe0 free; a verbs job opened it since: the delete is not sent.
    rdma = FakeRdma()
    rdma.made = {"rxe0": "eth0"}
    fs = FakeSysfs(tree)
    fs.process(7777, "ib_write_bw", fs.uverbs(0, "rxe0"))
    host = make_host(tree, rdma=rdma)
    result = await host.apply(
        DeleteRxe("rxe rxe0", "no longer declared", name="rxe0", netdev="eth0")
    )
    assert result.stale and "pid 7777 (ib_write_bw)" in result.note, result
    assert rdma.made == {"rxe0": "eth0"} and not host.records


async def test_a_guarded_stop_begun_since_the_plan_holds_what_would_bring_it_back(
    tree: Path,
) -> None:
    # `modprobe -r rdma_rxe` paused rdmad after the plan to add rxe0: the add (which would
    # load the module back) is dropped, not sent.
    rdma = FakeRdma()
    host = make_host(tree, rdma=rdma)
    write_pause(
        Sysfs(tree), by="rdmad-guard", reason="stack stop", seconds=60,
        modules=["rdma_rxe"], now=time.time(),
    )  # fmt: skip
    result = await host.apply(AddRxe("rxe rxe0", "declared", name="rxe0", netdev="eth0"))
    assert result.stale and "a guarded stop began" in result.note, result
    assert rdma.made == {} and not host.records


async def test_rxe_errors(tree: Path) -> None:
    failing = FakeRdma(fail=KernelError("add rxe link rxe0", "netdev eth0", errno.EEXIST))
    failing.made = {"rxe9": "eth0"}  # the netdev has an rxe link already: a real conflict
    result = await make_host(tree, rdma=failing).apply(AddRxe("o", "r", name="rxe0", netdev="eth0"))
    assert str(result.errors[0]) == "add rxe link rxe0 on netdev eth0: already exists (EEXIST)"
    none = await make_host(tree, rdma=FakeRdma(ok=False)).apply(
        AddRxe("o", "r", name="rxe0", netdev="eth0")
    )
    assert str(none.errors[0]) == (
        "add rxe link rxe0: protocol not supported by the driver (EPROTONOSUPPORT); "
        "the kernel has no RDMA netlink (NETLINK_RDMA)"
    )
    # Deleting a link that cannot be listed (no RDMA netlink, never observed): never blind.
    gone = await make_host(tree, rdma=FakeRdma(ok=False)).apply(DeleteRxe("o", "r", name="rxe0"))
    assert gone.stale and "already gone" in gone.note
    fake_root = await KernelHost(tree).apply(AddRxe("o", "r", name="rxe0", netdev="eth0"))
    assert "no RDMA netlink here" in str(fake_root.errors[0])


class ReleasingRdma(FakeRdma):
    """An add refused with ``errors`` in turn (the kernel still releasing the old
    device), then done; every attempt counted."""

    def __init__(self, *errors: KernelError) -> None:
        super().__init__()
        self.errors = list(errors)
        self.attempts = 0

    async def add_link(self, name: str, link_type: str, netdev: str) -> None:
        self.attempts += 1
        if self.errors:
            raise self.errors.pop(0)
        await super().add_link(name, link_type, netdev)


def _taken(code: int = errno.EEXIST) -> KernelError:
    return KernelError("add rxe link rxe0", "netdev eth0", code)


async def test_rxe_add_refused_while_the_old_device_is_released_is_sent_again(
    tree: Path,
) -> None:
    """The kernel sends an RDMA device's removal events before it frees the name: an add
    refused then (EEXIST, ENFILE, no such link listed) is sent again in place, and only
    the attempt that worked is recorded."""
    rdma = ReleasingRdma(_taken(), _taken(errno.ENFILE), _taken())
    host = make_host(tree, rdma=rdma)
    result = await host.apply(AddRxe("o", "r", name="rxe0", netdev="eth0"))
    assert result.outcome is Outcome.APPLIED and rdma.made == {"rxe0": "eth0"}
    assert rdma.attempts == 4
    assert [(r.target, r.error) for r in result.writes] == [("rdma link rxe0", None)]
    assert len(host.records) == 1


async def test_rxe_add_still_refused_at_the_release_wait_is_stale(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused the whole wait: not a failure to back off from, but stale (planned again
    from a new observation), with nothing recorded."""
    monkeypatch.setattr(host_mod, "RXE_RELEASE_WAIT", 0.03)
    rdma = ReleasingRdma(*[_taken()] * 1000)
    host = make_host(tree, rdma=rdma)
    result = await host.apply(AddRxe("o", "r", name="rxe0", netdev="eth0"))
    assert result.stale and not result.writes and "still being removed" in result.note
    assert 2 <= rdma.attempts < 20 and not host.records and not rdma.made


async def test_rxe_add_refused_otherwise_during_the_release_fails_with_that_error(
    tree: Path,
) -> None:
    """A refusal that is not the release ends the retries: it fails as any add does,
    with the kernel's words (here ENODEV while eth0 is still there)."""
    rdma = ReleasingRdma(_taken(), _taken(errno.ENODEV))
    result = await make_host(tree, rdma=rdma).apply(AddRxe("o", "r", name="rxe0", netdev="eth0"))
    assert rdma.attempts == 2 and not result.ok
    assert str(result.errors[0]) == "add rxe link rxe0 on netdev eth0: no such device (ENODEV)"


async def test_rxe_add_refused_as_its_netdev_is_deleted_is_stale(tree: Path) -> None:
    """Deleting a netdev removes its rxe device first: the add planned ahead for that
    removal can reach the kernel before the link news. ENODEV with the netdev gone
    from sysfs is the plan's observation out of date (stale), not a failed write."""
    rdma = ReleasingRdma(_taken(errno.ENODEV))
    host = make_host(tree, rdma=rdma)
    result = await host.apply(AddRxe("o", "r", name="rxe0", netdev="eth7"))
    assert rdma.attempts == 1 and result.stale and "netdev eth7 was deleted" in result.note
    assert not result.writes and not host.records and not rdma.made


async def test_rxe_add_refused_by_a_real_link_is_not_sent_again(tree: Path) -> None:
    rdma = ReleasingRdma(_taken())
    rdma.made = {"rxe0": "eth1"}  # listed, on a netdev that exists: a real conflict
    (tree / "sys/class/net/eth1").mkdir(parents=True, exist_ok=True)
    result = await make_host(tree, rdma=rdma).apply(AddRxe("o", "r", name="rxe0", netdev="eth0"))
    assert rdma.attempts == 1 and not result.ok and "EEXIST" in str(result.errors[0])


# --- not applied, dry run, observe -------------------------------------------------------------


async def test_blocked_and_waiting_change_nothing(tree: Path) -> None:
    host = make_host(tree)
    for action in (Blocked("o", "VF 1 held by pid 4242"), Waiting("o", "no VFs yet")):
        result = await host.apply(action)
        assert result.outcome is Outcome.NOT_APPLIED and result.ok
        assert action.reason in result.note
    assert not host.records


async def test_recording_host_changes_nothing(tree: Path) -> None:
    real = make_host(tree)
    dry = RecordingHost(real.observe)
    observed = await dry.observe()
    assert observed.pfs and dry.last is observed
    before = (tree / IGB_NUMVFS).read_text()
    result = await dry.apply(SetNumVfs("o", "restore", pci=IGB_PF, old=0, new=7))
    assert result.outcome is Outcome.RECORDED and result.ok
    assert (tree / IGB_NUMVFS).read_text() == before
    assert [(r.target, r.old, r.new, r.dry_run) for r in dry.records] == [
        (f"{IGB_PF} sriov_numvfs", 0, 7, True)
    ]
    assert (await dry.apply(Waiting("o", "later"))).outcome is Outcome.NOT_APPLIED
    assert not real.records


async def test_a_passing_rdma_netlink_failure_is_asked_again_next_pass(tree: Path) -> None:
    """Out of descriptors once is not "this kernel has no RDMA netlink": the next pass
    probes again and sees the links (before, the failed probe was kept until ib_core
    reloaded, and no rxe link could be made meanwhile)."""
    rdma = FakeRdma()
    rdma.made["rxe0"] = "eth0"
    rdma.transient = 1
    host = make_host(tree, rdma=rdma)
    first = await host.observe()
    assert not first.rdma_netlink
    assert "Too many open files" in " ".join(first.notes)
    second = await host.observe()
    assert second.rdma_netlink and second.rdma_link("rxe0") is not None
    await host.observe()
    assert rdma.probes == 2  # and kept once it answered


async def test_observe_uses_netlink_link_info_and_rdma(tree: Path) -> None:
    vfs = {0: VfSettings(mac="02:00:00:00:00:01", trust=True)}
    igb = pf_link(vfs)
    rdma = FakeRdma()
    rdma.made["rxe0"] = "eth0"
    host = make_host(tree, rtnl=FakeRtnl([igb]), rdma=rdma)
    observed = await host.observe()
    await host.observe()
    assert rdma.probes == 1, "RDMA netlink is probed once, not every pass"
    # Only enp94s0f0 is in the fake netlink: the names disagree, so it retried and said so.
    assert "netdevs kept changing while being observed" in observed.notes
    pf = next(p for p in observed.pfs if p.pci == IGB_PF)
    assert pf.ifindex == 3 and pf.operstate_up is True
    rxe = observed.rdma_link("rxe0")
    assert rxe is not None and rxe.netdev == "eth0"
    assert observed.rdma_netlink


async def test_observe_without_rdma_netlink(tree: Path) -> None:
    host = make_host(tree, rdma=FakeRdma(ok=False))
    observed = await host.observe()
    assert not observed.rdma_netlink
    assert any("NETLINK_RDMA" in n for n in observed.notes)
    # RDMA devices still come from sysfs
    assert observed.rdma_link("mlx5_0") is not None


# --- a real kernel refusal through RtNetlink ----------------------------------------


@pytest.fixture
def netns_veth() -> Iterator[str]:
    with owned_netns() as ns:
        subprocess.run(
            ["ip", "-n", ns, "link", "add", "rdh0", "type", "veth", "peer", "name", "rdh1"],
            check=True,
        )
        yield ns


@pytest.mark.netns
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces")
async def test_vf_settings_on_a_veth_get_the_kernels_refusal(tree: Path, netns_veth: str) -> None:
    rtnl = RtNetlink(netns_veth)
    host = make_host(tree, rtnl=rtnl)
    try:
        action = SetVfSettings(
            "o",
            "r",
            pci=IGB_PF,
            pf_netdev="rdh0",
            changes=(
                VfChange(0, "mac", None, "02:00:00:00:00:09"),
                VfChange(0, "trust", None, True),
            ),
        )
        result = await host.apply(action)
    finally:
        host.close()
    assert result.outcome is Outcome.FAILED
    assert len(result.errors) == 2
    for error in result.errors:
        assert error.errno is not None
        assert str(error).startswith("set vf 0 ") and " on rdh0: " in str(error)


# --- the event path's narrow observation ----------------------------------------------------


def newlink(name: str, ifindex: int, mac: str, kind: str, up: bool = False) -> bytes:
    """An RTM_NEWLINK payload as the kernel announces a link (no VF lists)."""
    return (
        IFINFO.pack(0, 1, ifindex, IFF_UP if up else 0, 0)
        + attr(IFLA_IFNAME, asciiz(name))
        + attr(IFLA_ADDRESS, bytes.fromhex(mac.replace(":", "")))
        + nested(IFLA_LINKINFO, [attr(IFLA_INFO_KIND, asciiz(kind))])
    )


class CountingRtnl(FakeRtnl):
    def __init__(self, links: list[LinkInfo]) -> None:
        super().__init__(links)
        self.dumps = 0

    async def links(self, vfs: bool = True) -> list[LinkInfo]:
        self.dumps += 1
        return await super().links(vfs)


class CountingKernelish(CountingSysfs, KernelishSysfs):
    pass


async def test_one_observation_reads_the_pause_file_once(tree: Path) -> None:
    """Whether to stand back (no RDMA netlink while a guarded stop runs) and the
    snapshot's pause are one read of the pause file: in a full observation, and in a
    narrow one after link news."""
    rtnl = CountingRtnl([pf_link({})])
    host = make_host(tree, rtnl=rtnl, rdma=FakeRdma())
    host.sysfs = counting = CountingKernelish(tree)
    full = await host.observe()
    # (This fake's netlink and sysfs disagree, so observe() tries three times: one
    # rtnetlink dump and one pause read each.)
    assert full.pause is None and counting.asked[("read", PAUSE_FILE)] == rtnl.dumps
    counting.asked.clear()
    news = {88: newlink("veth8", 88, "02:00:00:00:08:08", "veth", up=True)}
    narrow = await host.observe_changed(False, news)
    assert narrow is not None and narrow.pause is None
    assert counting.asked[("read", PAUSE_FILE)] == 1
    # A guarded stop in force: the one read says so to both.
    write_pause(counting, by="guard", reason="test", seconds=60, modules=[], now=time.time())
    counting.asked.clear()
    assert await host.observe_changed(False, news) is None  # observe() stands back
    assert counting.asked[("read", PAUSE_FILE)] == 1
    counting.asked.clear()
    dumps = rtnl.dumps
    paused = await host.observe()
    assert paused.pause is not None and paused.pause.by == "guard"
    assert paused.pause_record == paused.pause
    assert counting.asked[("read", PAUSE_FILE)] == rtnl.dumps - dumps


async def test_narrow_observation_reads_link_news_instead_of_a_dump(tree: Path) -> None:
    rtnl = CountingRtnl([pf_link({})])
    rdma = FakeRdma()
    host = make_host(tree, rtnl=rtnl, rdma=rdma)
    full = await host.observe()
    dumps = rtnl.dumps
    news = {88: newlink("veth8", 88, "02:00:00:00:08:08", "veth", up=True)}
    seen = await host.observe_changed(False, news)
    assert rtnl.dumps == dumps, "news, not a dump"
    assert seen is not None and seen.pfs is full.pfs
    veth = seen.netdev("veth8")
    assert veth is not None and veth.ifindex == 88 and veth.up and veth.pci is None
    # The veth's rxe link appears; the veth is renamed: the RDMA links are read again.
    rdma.made["rxe8"] = "veth8"
    renamed = await host.observe_changed(
        True, {88: newlink("veth9", 88, "02:00:00:00:08:08", "veth")}
    )
    assert renamed is not None and renamed.netdev("veth8") is None
    assert renamed.netdev("veth9") is not None and renamed.rdma_link("rxe8") is not None
    gone = await host.observe_changed(False, {88: None})
    assert gone is not None and gone.netdevs == full.netdevs and rtnl.dumps == dumps
    # Without news (a udev net event): one dump; news it cannot read: everything.
    rtnl._links = [
        LinkInfo(n.name, n.ifindex, n.mac, n.perm_mac, n.up, "up", None) for n in full.netdevs
    ]
    assert await host.observe_changed(False, None) is not None and rtnl.dumps == dumps + 1
    assert await host.observe_changed(False, {88: b"\x00\x01"}) is None


# --- an add a reflex sent (kernel.events.reflex) ---------------------------------------------


async def test_an_add_a_reflex_sent_is_collected_not_sent_again(tree: Path) -> None:
    from rdmad.kernel.events.reflex import RxeReflex

    from .test_reflex import FakeKernel

    kernel = FakeKernel()
    (tree / "sys/module/ib_core").mkdir(parents=True, exist_ok=True)
    rdma = ReleasingRdma()
    host = make_host(tree, rdma=rdma)
    host.reflex = RxeReflex(host.sysfs, host.clock, opener=kernel.open)
    add = AddRxe("rxe rxe0", "declared", name="rxe0", netdev="eth0")
    try:
        # Answered: the pass records it; RDMA netlink is not asked again.
        host.arm_reflexes({"eth0": [add]}, {}, lambda a: True, lambda a: None)
        host.reflex.netdev_added("eth0")
        kernel.answer_next(0)
        result = await host.apply(add)
        assert result.outcome is Outcome.APPLIED and rdma.attempts == 0
        assert [(r.target, r.error) for r in result.writes] == [("rdma link rxe0", None)]

        # Refused as taken on a new netdev: the pass sends it the usual way.
        host.arm_reflexes({"eth0": [add]}, {}, lambda a: True, lambda a: None)
        host.reflex.netdev_added("eth0")
        kernel.answer_next(errno.EEXIST)
        result = await host.apply(add)
        assert result.outcome is Outcome.APPLIED and rdma.attempts == 1

        # Refused otherwise: sent again, and the kernel's fresh answer is the result.
        host.arm_reflexes({"eth0": [add]}, {}, lambda a: True, lambda a: None)
        host.disarm_reflexes()
        host.reflex.netdev_added("eth0")  # disarmed: nothing sent
        assert kernel.request() is None
        host.arm_reflexes({"eth0": [add]}, {}, lambda a: True, lambda a: None)
        host.reflex.netdev_added("eth0")
        kernel.answer_next(errno.ENODEV)
        rdma.errors = [KernelError("add rxe link rxe0", "netdev eth0", errno.ENODEV)]
        result = await host.apply(add)
        assert result.outcome is Outcome.FAILED and rdma.attempts == 2
        error = result.writes[0].error
        assert error is not None and error.errno == errno.ENODEV
    finally:
        host.close()
        kernel.close()


# --- the RDMA netns mode ------------------------------------------------------------------


async def test_netns_mode_option_then_live_mode_and_ebusy_in_words(tree: Path) -> None:
    (tree / "etc/modprobe.d").mkdir(parents=True, exist_ok=True)
    rdma = FakeRdma()
    host = make_host(tree, rdma=rdma)
    done = await host.apply(SyncIbCoreOptions("rdma", "r", mode="exclusive", old=None))
    assert done.outcome is Outcome.APPLIED, done.describe()
    assert (tree / OPTIONS_FILE).read_text().endswith("options ib_core netns_mode=0\n")
    done = await host.apply(SetRdmaNetnsMode("rdma", "r", old="shared", new="exclusive"))
    assert done.outcome is Outcome.APPLIED and rdma.netns_modes == ["exclusive"]
    assert [(w.target, w.old, w.new) for w in done.writes] == [
        ("rdma system netns", "shared", "exclusive")
    ]
    rdma.fail = KernelError("set the RDMA netns mode shared", "", errno.EBUSY, "a namespace")
    done = await host.apply(SetRdmaNetnsMode("rdma", "r", old="exclusive", new="shared"))
    assert done.outcome is Outcome.FAILED and "busy (EBUSY)" in done.describe()
    done = await host.apply(SyncIbCoreOptions("rdma", "r", mode=None, old="exclusive"))
    assert done.outcome is Outcome.APPLIED and not (tree / OPTIONS_FILE).exists()
