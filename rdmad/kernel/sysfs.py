"""Where the kernel keeps what: PCI functions and SR-IOV, netdevs, RDMA devices,
modules and kernel switches, processes, under /sys and /proc.

``Sysfs(root)`` makes every sysfs and procfs read or write in rdmad. The reads and the
write themselves, and what a failed one means (None, or ``Unreadable`` where a safety
decision rests on it), are ``SysfsFiles``' (``kernel.sysfs_files``); this class knows
the kernel's layout: which file or link says what about a device.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Sequence
from typing import NamedTuple

from rdmad.kernel.sysfs_files import SysfsFiles, Unreadable
from rdmad.pfselect import own_netdev

PCI_DEVICES = "sys/bus/pci/devices"
# netdevsim devices are SR-IOV PFs that are not PCI functions (the lab's full-attribute
# PF): sriov_numvfs lives in their bus directory, there is no sriov_totalvfs (the limit
# is debugfs max_vfs) and their VFs are indexes, not devices.
NSIM_DEVICES = "sys/bus/netdevsim/devices"
NSIM_DEBUGFS = "sys/kernel/debug/netdevsim"
NSIM_DEFAULT_MAX_VFS = 4  # netdevsim's limit until debugfs max_vfs raises it
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# phys_port_name of a switchdev representor: pf0, pf0vf1, pf0sf3, c1pf0vf1 (mlx5, the
# kernel's devlink port naming); an uplink is p0/p1 or has no phys_port_name at all.
_VF_REPRESENTOR_PORT = re.compile(r"^(?:c\d+)?pf\d+vf(\d+)$")
CLASS_NET = "sys/class/net"
CLASS_IB = "sys/class/infiniband"


class PciFunction(NamedTuple):
    pci: str
    driver: str | None
    driver_override: str | None
    numvfs: int | None  # None: not SR-IOV capable
    totalvfs: int | None
    drivers_autoprobe: bool | None  # None: no sriov_drivers_autoprobe (netdevsim has none)
    netdevs: tuple[str, ...]
    ib_devices: tuple[str, ...]
    iommu_group: str | None
    physfn: str | None
    # Reads of the above that failed (Unreadable reasons): who holds the function is
    # unknown, whatever the fields say.
    unreadable: tuple[str, ...] = ()
    # sriov_drivers_autoprobe there but not readable (EIO...): unknown, not "none".
    autoprobe_unread: str | None = None


class Sysfs(SysfsFiles):
    """The kernel's files under ``root`` by what they describe (see the module)."""

    # --- PCI ---------------------------------------------------------------------------

    def pci_addresses(self) -> list[str]:
        return self.listdir(PCI_DEVICES)

    @staticmethod
    def is_netdevsim(dev: str) -> bool:
        return dev.startswith("netdevsim")

    def device_dir(self, dev: str) -> str:
        """sysfs directory of a PF: a PCI address, or a netdevsim device name."""
        return f"{NSIM_DEVICES}/{dev}" if self.is_netdevsim(dev) else f"{PCI_DEVICES}/{dev}"

    def pci_function(self, pci: str) -> PciFunction | None:
        base = self.device_dir(pci)
        if not self.exists(base):
            return None
        # What decides who can hold the function (its driver, its iommu group, its
        # netdevs and RDMA devices): a failed read is remembered, not taken as "none".
        unreadable: list[str] = []

        def entries(rel: str) -> tuple[str, ...]:
            try:
                # No net/ or infiniband/ directory: no netdev or RDMA device.
                return tuple(self.entries(rel, optional=True))
            except Unreadable as exc:
                unreadable.append(exc.reason)
                return ()

        def link(rel: str) -> str | None:
            try:
                return self.link_known(rel)
            except Unreadable as exc:
                unreadable.append(exc.reason)
                return None

        override = self.read(f"{base}/driver_override")
        physfn = self.link_name(f"{base}/physfn")
        # A VF has no SR-IOV capability, so no sriov_* files: not opening them is
        # 3 of a VF's ~8 opens, and observe() reads every VF twice per pass.
        autoprobe = numvfs = totalvfs = None
        autoprobe_unread = None
        if physfn is None:
            try:
                text = self.read_known(f"{base}/sriov_drivers_autoprobe")
                autoprobe = int(text) if text is not None and text.isdigit() else None
            except Unreadable as exc:
                autoprobe_unread = exc.reason
            numvfs = self.read_int(f"{base}/sriov_numvfs")
            totalvfs = self.read_int(f"{base}/sriov_totalvfs")
        if totalvfs is None and self.is_netdevsim(pci) and self.exists(f"{base}/sriov_numvfs"):
            totalvfs = self.read_int(f"{NSIM_DEBUGFS}/{pci}/max_vfs") or NSIM_DEFAULT_MAX_VFS
        return PciFunction(
            pci=pci,
            driver=link(f"{base}/driver"),
            driver_override=None if override in (None, "(null)", "") else override,
            numvfs=numvfs,
            totalvfs=totalvfs,
            drivers_autoprobe=None if autoprobe is None else autoprobe != 0,
            netdevs=entries(f"{base}/net"),
            ib_devices=entries(f"{base}/infiniband"),
            iommu_group=link(f"{base}/iommu_group"),
            physfn=physfn,
            unreadable=tuple(unreadable),
            autoprobe_unread=autoprobe_unread,
        )

    def pci_ids(self, dev: str) -> tuple[str | None, str | None]:
        """(vendor, device) of a PCI function as 4 lowercase hex digits ("8086", "10c9");
        (None, None) for a netdevsim device, which has neither."""
        if self.is_netdevsim(dev):
            return None, None
        base = self.device_dir(dev)
        ids = []
        for name in ("vendor", "device"):
            text = (self.read(f"{base}/{name}") or "").strip().lower().removeprefix("0x")
            ids.append(text if re.fullmatch(r"[0-9a-f]{4}", text) else None)
        return ids[0], ids[1]

    def machine_id(self) -> str | None:
        """/etc/machine-id under the root: 32 hex digits, or None (absent, empty on a
        first boot, "uninitialized", unreadable)."""
        text = (self.read("etc/machine-id") or "").strip().lower()
        return text if re.fullmatch(r"[0-9a-f]{32}", text) else None

    def sriov_pfs(self) -> list[str]:
        """PCI functions that can have VFs, then netdevsim devices (named netdevsimN)."""
        pci = [p for p in self.pci_addresses() if self.exists(f"{PCI_DEVICES}/{p}/sriov_totalvfs")]
        nsim = [
            d
            for d in self.listdir(NSIM_DEVICES)
            if self.is_netdevsim(d) and self.exists(f"{NSIM_DEVICES}/{d}/sriov_numvfs")
        ]
        return pci + nsim

    def virtfns(self, pci: str) -> dict[int, str]:
        """VF index -> VF PCI address, from the PF's virtfnN links; Unreadable when they
        cannot be listed (the VFs a write would destroy are then unknown, not none).

        A PF that is gone has no VFs; a virtfn link that vanished is a VF removed meanwhile.
        """
        out: dict[int, str] = {}
        base = f"{PCI_DEVICES}/{pci}"
        for entry in self.entries(base, optional=True):
            if entry.startswith("virtfn") and entry[6:].isdigit():
                target = self.link_known(f"{base}/{entry}")
                if target:
                    out[int(entry[6:])] = target
        return out

    # --- network devices ---------------------------------------------------------------

    def netdevs(self) -> list[str]:
        return self.listdir(CLASS_NET)

    def netdev_attr(self, name: str, attr: str) -> str | None:
        return self.read(f"{CLASS_NET}/{name}/{attr}")

    def netdev_exists(self, name: str) -> bool:
        return self.exists(f"{CLASS_NET}/{name}")

    def own_netdev(self, names: Sequence[str]) -> str | None:
        """The netdev that stands for a PCI function itself, among those under its net/.

        A function can carry several netdevs: a switchdev PF also carries its VF and
        PF representors (phys_port_name pfNvfM, pfN, pfNsfM, cCpfN...), and mlx4 puts
        both ports of a card on one function (dev_port 0 and 1). The function's own
        netdev is the one that is not a representor, lowest dev_port first, then by
        name so the choice is stable. None when there is none.
        """
        return own_netdev(
            (
                name,
                self.netdev_attr(name, "phys_port_name"),
                self.read_int(f"{CLASS_NET}/{name}/dev_port") or 0,
            )
            for name in names
        )

    def vf_representors(self, pf: str) -> dict[int, str]:
        """VF index -> representor netdev, from the phys_port_name (pfNvfM) of the PF's
        netdevs: what a re-check and the guard read (observation asks devlink).
        Unreadable when the PF's netdevs or a name cannot be read."""
        out: dict[int, str] = {}
        base = f"{self.device_dir(pf)}/net"
        for name in self.entries(base, optional=True):
            try:
                port = self.read_known(f"{base}/{name}/phys_port_name")
            except Unreadable as exc:
                if exc.errno != errno.EOPNOTSUPP:
                    raise
                port = None  # a netdev without port names (igb, virtio): not a representor
            m = _VF_REPRESENTOR_PORT.match(port or "")
            if m is not None:
                out[int(m.group(1))] = name
        return out

    def netdev_pci(self, name: str) -> str | None:
        """The PCI function behind a netdev; None for virtual devices.

        A virtio NIC's device is a virtio bus device (virtioN) whose parent is
        the PCI function lspci shows; that is the address operators know.
        """
        device = f"{CLASS_NET}/{name}/device"
        subsystem = self.link_name(f"{device}/subsystem")
        if subsystem == "virtio":
            device = f"{device}/.."
            subsystem = self.link_name(f"{device}/subsystem")
        if subsystem not in (None, "pci"):
            return None
        try:
            if device.endswith("/.."):
                target = os.path.basename(os.path.realpath(self.path(device)))
            else:
                # The device link points at the function's directory, whose name is
                # its address: one readlink, where realpath() lstat()s every component
                # (a quarter of an observe() pass over many VFs).
                target = os.path.basename(os.readlink(self.path(device)))
        except OSError:
            return None
        return target if _PCI_ADDRESS.match(target) else None

    # --- InfiniBand ----------------------------------------------------------------------

    def ib_devices(self) -> list[str]:
        return self.listdir(CLASS_IB)

    def ib_attr(self, dev: str, attr: str) -> str | None:
        return self.read(f"{CLASS_IB}/{dev}/{attr}")

    def ib_port_netdevs(self, dev: str, port: int = 1) -> list[str]:
        base = f"{CLASS_IB}/{dev}/ports/{port}/gid_attrs/ndevs"
        names = {self.read(f"{base}/{n}") for n in self.listdir(base)}
        return sorted(n for n in names if n)

    def ib_gids(self, dev: str, port: int = 1, limit: int = 32) -> tuple[str, ...] | None:
        """The valid GIDs among the first ``limit`` entries of a port's table; None when
        the table cannot be read. ib_core puts a new GID at the lowest free index, so
        the first entries hold every GID unless many were deleted and none added since
        (rxe's table has 1,024 entries: reading them all on every pass is not cheap)."""
        base = f"{CLASS_IB}/{dev}/ports/{port}/gids"
        out = []
        for index in range(limit):
            gid = self.read(f"{base}/{index}")
            if gid is None:
                if index == 0:
                    return None
                break  # a shorter table
            if gid.replace("0", "").replace(":", ""):  # the kernel prints a free entry as 0s
                out.append(gid)
        return tuple(out)

    def ib_port_state(self, dev: str, port: int = 1) -> str | None:
        """Port state as sysfs prints it ("4: ACTIVE" -> "ACTIVE"); None when unreadable."""
        text = self.read(f"{CLASS_IB}/{dev}/ports/{port}/state")
        if text is None:
            return None
        return text.partition(":")[2].strip() or None

    def ib_driver(self, dev: str) -> str | None:
        """Kernel driver of an RDMA device: the PCI driver, or 'rxe' for Soft-RoCE."""
        driver = self.link_name(f"{CLASS_IB}/{dev}/device/driver")
        if driver is not None:
            return driver
        # rxe has no parent PCI device; it exposes the netdev it sits on as 'parent'.
        if self.read(f"{CLASS_IB}/{dev}/parent") is not None:
            return "rxe"
        return None

    def ib_vf_dir(self, dev: str, vf: int) -> str:
        return f"{CLASS_IB}/{dev}/device/sriov/{vf}"

    def ib_vf(self, dev: str, vf: int) -> dict[str, str | None] | None:
        base = self.ib_vf_dir(dev, vf)
        if not self.exists(base):
            return None
        return {
            "node_guid": self.read(f"{base}/node"),
            "port_guid": self.read(f"{base}/port"),
            "policy": self.read(f"{base}/policy"),
        }

    # --- modules and kernel switches -------------------------------------------------------

    def loaded_modules(self) -> frozenset[str]:
        """Modules that are loaded (built-ins have no initstate and are not listed)."""
        return frozenset(
            m
            for m in self.listdir("sys/module")
            if self.read(f"sys/module/{m}/initstate") == "live"
        )

    def module_holders(self, module: str) -> list[str]:
        return self.listdir(f"sys/module/{module}/holders")

    def module_refcnt(self, module: str) -> int | None:
        return self.read_int(f"sys/module/{module}/refcnt")

    def module_params(self, module: str) -> dict[str, str | None]:
        base = f"sys/module/{module}/parameters"
        return {p: self.read(f"{base}/{p}") for p in self.listdir(base)}

    def modules_disabled(self) -> bool:
        return self.read_int("proc/sys/kernel/modules_disabled") == 1

    def cmdline(self) -> str:
        return self.read("proc/cmdline") or ""

    def vfio_cdevs(self, pci: str) -> list[str]:
        """/dev/vfio/devices/vfioN nodes of a device bound to vfio-pci (iommufd's cdev);
        Unreadable when they cannot be listed. No vfio-dev/ directory: no cdev (a kernel
        without iommufd's cdev, or the device not on vfio-pci)."""
        rel = f"{PCI_DEVICES}/{pci}/vfio-dev"
        return [f"/dev/vfio/devices/{n}" for n in self.entries(rel, optional=True)]

    def iommu_group_type(self, group: str) -> str | None:
        return self.read(f"sys/kernel/iommu_groups/{group}/type")

    # --- processes (for usage) -------------------------------------------------------------

    def pids(self) -> list[str]:
        """Every process; Unreadable when /proc cannot be listed (EMFILE under a flood of
        connections, a missing /proc): then nobody's open files are known."""
        return [entry for entry in self.entries("proc") if entry.isdigit()]

    def comm(self, pid: str) -> str:
        """A process's name, for messages only: "?" when it cannot be read."""
        try:
            return self.read(f"proc/{pid}/comm") or "?"
        except OSError:
            return "?"

    def netns_id(self, rel: str) -> tuple[int, int] | None:
        """(device, inode) naming the network namespace a file stands for, e.g.
        ``proc/PID/ns/net`` or ``run/netns/NAME``; None when it cannot be read."""
        try:
            st = os.stat(self.path(rel))
        except OSError:
            return None
        return (st.st_dev, st.st_ino)


class OnceReads(Sysfs):
    """``fs`` with each file read, listed, stat'ed or tested once: one snapshot's answers.

    Three readers of one observation ask the same of /proc/modules, /sys/module, the
    module switches and the running kernel's release (the loaded modules, the
    peer-memory facts, rdma_rxe's availability); through this they ask the kernel once.
    Made per observation and dropped with it: never for a re-check right before a
    write, which must ask the kernel now. Reads go to ``fs``'s own methods, so a tree
    that fails reads on purpose (the tests') fails them here too.
    """

    def __init__(self, fs: Sysfs) -> None:
        super().__init__(fs.root)
        self._fs = fs
        self._read: dict[str, str | None] = {}
        self._bytes: dict[str, bytes | None] = {}
        self._stamp: dict[str, tuple[int, int] | None] = {}
        self._listed: dict[str, list[str]] = {}
        self._exists: dict[str, bool] = {}

    def read(self, rel: str) -> str | None:
        if rel not in self._read:
            self._read[rel] = self._fs.read(rel)
        return self._read[rel]

    def read_bytes(self, rel: str) -> bytes | None:
        if rel not in self._bytes:
            self._bytes[rel] = self._fs.read_bytes(rel)
        return self._bytes[rel]

    def stamp(self, rel: str) -> tuple[int, int] | None:
        if rel not in self._stamp:
            self._stamp[rel] = self._fs.stamp(rel)
        return self._stamp[rel]

    def listdir(self, rel: str) -> list[str]:
        if rel not in self._listed:
            self._listed[rel] = self._fs.listdir(rel)
        return list(self._listed[rel])  # a copy: a caller may sort or extend it

    def exists(self, rel: str) -> bool:
        if rel not in self._exists:
            self._exists[rel] = self._fs.exists(rel)
        return self._exists[rel]

    def present(self, rel: str) -> bool:
        return self._fs.present(rel)  # not kept: a failed lookup must fail each time
