"""Who uses a VF or an RDMA device. When it cannot be told, the answer is "in use".

A VF is in use when (FIELD.md):
* it is bound to vfio-pci and a process holds its /dev/vfio/GROUP open;
* a libvirt domain lists it as a hostdev (/run/libvirt/qemu/*.xml);
* its RDMA device has /dev/infiniband/uverbs* handles open;
* it is bound to a network driver but its netdev is not in this namespace
  (moved into a container) — we cannot see inside, so it counts as in use.

Open files are read once per observation (``OpenFiles.scan``): one walk of
/proc/*/fd serves every VF and RDMA device.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field

from rdmad.kernel.sysfs import Sysfs
from rdmad.model import FREE, RdmaLinkObserved, Usage, Use

# Drivers that hand the whole function to user space or a guest.
PASSTHROUGH_DRIVERS = frozenset({"vfio-pci", "pci-stub"})


@dataclass
class OpenFiles:
    """Device node path -> processes holding it, for /dev/vfio and /dev/infiniband."""

    holders: dict[str, list[str]] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # pids whose fds could not be read

    @classmethod
    def scan(cls, sysfs: Sysfs) -> OpenFiles:
        found = cls()
        for pid in sysfs.pids():
            base = sysfs.path(f"proc/{pid}/fd")
            try:
                fds = os.listdir(base)
            except FileNotFoundError:
                continue  # exited meanwhile
            except PermissionError:
                found.unreadable.append(pid)
                continue
            comm = None
            prefix = f"{base}/"  # str joins: pathlib per fd dominated observe() under TCG
            for fd in fds:
                try:
                    target = os.readlink(prefix + fd)
                except OSError:
                    continue
                if target.startswith(("/dev/vfio/", "/dev/infiniband/")):
                    comm = comm or sysfs.comm(pid)
                    found.holders.setdefault(target, []).append(f"pid {pid} ({comm})")
        return found

    def held(self, node: str) -> list[str]:
        return self.holders.get(node, [])


def libvirt_hostdevs(sysfs: Sysfs) -> dict[str, str]:
    """PCI address -> libvirt domain name, from the running domains' status XML."""
    out: dict[str, str] = {}
    base = "run/libvirt/qemu"
    for entry in sysfs.listdir(base):
        if not entry.endswith(".xml"):
            continue
        try:
            tree = ET.parse(sysfs.path(f"{base}/{entry}"))
        except (ET.ParseError, OSError):
            continue
        domain = tree.find(".//domain/name")
        name = domain.text if domain is not None and domain.text else entry[:-4]
        for addr in tree.iterfind(".//hostdev/source/address"):
            try:
                pci = "{:04x}:{:02x}:{:02x}.{:x}".format(
                    *(int(addr.get(k, "0"), 0) for k in ("domain", "bus", "slot", "function"))
                )
            except ValueError:
                continue
            out[pci] = name
    return out


def uverbs_nodes(sysfs: Sysfs, ib_device: str) -> list[str]:
    """/dev/infiniband/uverbsN nodes that belong to an RDMA device."""
    base = "sys/class/infiniband_verbs"
    return [
        f"/dev/infiniband/{n}"
        for n in sysfs.listdir(base)
        if n.startswith("uverbs") and sysfs.read(f"{base}/{n}/ibdev") == ib_device
    ]


def rdma_device_usage(sysfs: Sysfs, files: OpenFiles, ib_device: str) -> Usage:
    holders = [
        f"{h} holds {node}" for node in uverbs_nodes(sysfs, ib_device) for h in files.held(node)
    ]
    if holders:
        return Usage(Use.IN_USE, tuple(holders))
    if files.unreadable:
        return _unknown(files)
    return FREE


def vf_usage(sysfs: Sysfs, files: OpenFiles, libvirt: dict[str, str], vf_pci: str) -> Usage:
    fn = sysfs.pci_function(vf_pci)
    if fn is None:
        return FREE  # gone: nothing can hold it
    holders: list[str] = []
    if vf_pci in libvirt:
        holders.append(f"libvirt domain {libvirt[vf_pci]!r} has it as a hostdev")
    if fn.driver in PASSTHROUGH_DRIVERS and fn.iommu_group is not None:
        for node in (f"/dev/vfio/{fn.iommu_group}", f"/dev/vfio/noiommu-{fn.iommu_group}"):
            holders.extend(f"{h} holds {node}" for h in files.held(node))
    for ib in fn.ib_devices:
        for node in uverbs_nodes(sysfs, ib):
            holders.extend(f"{h} holds {node}" for h in files.held(node))
    if holders:
        return Usage(Use.IN_USE, tuple(holders))
    bound_to_kernel_driver = fn.driver is not None and fn.driver not in PASSTHROUGH_DRIVERS
    if bound_to_kernel_driver and not fn.netdevs and not fn.ib_devices:
        return Usage(
            Use.UNKNOWN,
            (
                f"bound to {fn.driver} but its netdev is not in this network namespace "
                "(moved into a container?)",
            ),
        )
    if files.unreadable:
        return _unknown(files)
    return FREE


def _unknown(files: OpenFiles) -> Usage:
    sample = ", ".join(files.unreadable[:3])
    return Usage(Use.UNKNOWN, (f"open files of pid {sample} could not be read (not root?)",))


def vf_usage_now(sysfs: Sysfs, vf_pci: str, rdma_links: Sequence[RdmaLinkObserved] = ()) -> Usage:
    """A fresh answer for one VF, for the re-check right before a destructive write."""
    return vf_usage(sysfs, OpenFiles.scan(sysfs), libvirt_hostdevs(sysfs), vf_pci)


def rdma_link_usage_now(sysfs: Sysfs, link: RdmaLinkObserved) -> Usage:
    """A fresh answer for one RDMA link, for the re-check right before deleting it."""
    return rdma_device_usage(sysfs, OpenFiles.scan(sysfs), link.name)
