"""Who uses a VF or an RDMA device. When it cannot be told, the answer is "in use".

A VF is in use when (FIELD.md):
* it is bound to vfio-pci and a process holds its /dev/vfio/GROUP (legacy group)
  or /dev/vfio/devices/vfioN (iommufd cdev, sysfs ``vfio-dev/vfioN``) open; bound to
  vfio-pci without an iommu_group, nobody can tell: unknown;
* a libvirt domain lists it as a ``<hostdev>`` or an ``<interface type='hostdev'>``
  (/run/libvirt/qemu/*.xml); a status file that cannot be parsed: unknown;
* its own RDMA device has users (/dev/infiniband/uverbs* handles, kernel users);
* an RDMA link (rxe, siw) sits on its netdev: busy even when nobody holds the
  link. Destroying the VF under a held rxe link hangs the kernel (igbvf_remove
  waits in netdev_run_todo forever, measured on 6.1), and kernel users of a link
  cannot be ruled out on every kernel;
* its netdev is in another network namespace (a pod's, moved there by the SR-IOV
  CNI): in use, naming the namespace, whatever else the VF shows. The CNI moves the
  netdev only; with RDMA netns mode "shared" (the kernel's default) the VF's RDMA
  device stays here, so a VF with an RDMA device but no netdev here is looked for
  too. Where the VF must have a netdev (no RDMA device, or a RoCE one: an Ethernet
  port) and it is found nowhere, or the look fails: unknown. An InfiniBand VF may
  have none (IPoIB not loaded): in use when found elsewhere, unknown when the look
  fails, free when it succeeds and finds nothing.

Open files are read once per observation (``OpenFiles.scan``): one walk of
/proc/*/fd serves every VF and RDMA device. Which namespace a hidden netdev went
to is looked up only when one is hidden (``Namespaces``: rtnetlink queries and a
light /proc/*/ns/net pass to name the processes in it).

``vf_usage_now``/``rdma_link_usage_now`` are the same code over a fresh scan, for
a re-check right before a destructive write.

A listing or read that fails here is "unknown" with its reason ("cannot list /proc:
Too many open files"), never "nothing there" (``sysfs_files.Unreadable``). Only where
absence has a meaning is it "none": no /run/libvirt/qemu (no libvirt), no
/sys/class/infiniband_verbs (ib_uverbs not loaded), a process or fd that went away
while /proc was walked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from rdmad.kernel.errors import KernelError
from rdmad.kernel.sysfs import CLASS_IB, PCI_DEVICES, PciFunction, Sysfs
from rdmad.kernel.sysfs_files import Unreadable
from rdmad.kernel.usage.netns import ForeignNetdev, NetnsQuery
from rdmad.model.shared_observed import FREE, RdmaLinkObserved, Usage, Use

# Drivers that hand the whole function to user space or a guest.
PASSTHROUGH_DRIVERS = frozenset({"vfio-pci", "pci-stub"})
_HELD_PREFIXES = ("/dev/vfio/", "/dev/infiniband/")
_PIDS_NAMED = 5  # holders name at most this many processes of a namespace


def combine(*usages: Usage) -> Usage:
    """IN_USE beats UNKNOWN beats FREE; holders concatenated in order, without repeats."""
    state = Use.FREE
    for u in usages:
        if u.state is Use.IN_USE or (u.state is Use.UNKNOWN and state is Use.FREE):
            state = u.state
    if state is Use.FREE:
        return FREE
    holders = dict.fromkeys(h for u in usages if u.state is not Use.FREE for h in u.holders)
    return Usage(state, tuple(holders))


@dataclass
class OpenFiles:
    """Device node path -> processes holding it, for /dev/vfio and /dev/infiniband."""

    holders: dict[str, list[str]] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # "pid N (comm)" whose fds were unreadable
    failed: str | None = None  # /proc itself could not be listed: nobody's files are known

    @classmethod
    def scan(cls, sysfs: Sysfs) -> OpenFiles:
        found = cls()
        try:
            pids = sysfs.pids()
        except Unreadable as exc:
            return cls(failed=exc.reason)
        for pid in pids:
            base = sysfs.path(f"proc/{pid}/fd")
            try:
                fds = os.listdir(base)
            except FileNotFoundError:
                continue  # exited meanwhile: it holds nothing any more
            except OSError:  # EACCES without CAP_SYS_PTRACE/DAC_READ_SEARCH, EMFILE, EIO
                found.unreadable.append(f"pid {pid} ({sysfs.comm(pid)})")
                continue
            comm = None
            prefix = f"{base}/"  # str joins: pathlib per fd dominated observe() under TCG
            for fd in fds:
                try:
                    target = os.readlink(prefix + fd)
                except FileNotFoundError:
                    continue  # closed meanwhile (or the process exited)
                except OSError:
                    found.unreadable.append(f"pid {pid} ({sysfs.comm(pid)})")
                    break
                if target.startswith(_HELD_PREFIXES):
                    comm = comm or sysfs.comm(pid)
                    found.holders.setdefault(target, []).append(f"pid {pid} ({comm})")
        return found

    def held(self, node: str) -> list[str]:
        return self.holders.get(node, [])

    def holding(self, nodes: Iterable[str]) -> list[str]:
        return [f"{h} holds {node}" for node in nodes for h in self.held(node)]

    def unknown(self) -> Usage | None:
        """UNKNOWN naming why open files are unknown (/proc unlisted, or the processes
        whose files could not be read), if they are."""
        if self.failed is not None:
            return Usage(Use.UNKNOWN, (f"{self.failed}: no process's open files were read",))
        if not self.unreadable:
            return None
        more = len(self.unreadable) - 3
        sample = ", ".join(self.unreadable[:3]) + (f" and {more} more" if more > 0 else "")
        return Usage(Use.UNKNOWN, (f"open files of {sample} could not be read",))


@dataclass
class Libvirt:
    """PCI address -> libvirt domain name, from the running domains' status XML."""

    hostdevs: dict[str, str] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # status files that did not parse
    failed: str | None = None  # the status directory could not be listed

    @classmethod
    def scan(cls, sysfs: Sysfs) -> Libvirt:
        found = cls()
        base = "run/libvirt/qemu"
        try:
            # No directory: libvirt's QEMU driver is not running here, no domain has a VF.
            entries = sysfs.entries(base, optional=True)
        except Unreadable as exc:
            return cls(failed=exc.reason)
        for entry in entries:
            if not entry.endswith(".xml"):
                continue
            # Here, not at the top: most nodes run no VM, and a daemon's start need not
            # pay for the XML parser (1.5 ms of its import on a host, tens under TCG).
            import xml.etree.ElementTree as ET

            try:
                tree = ET.parse(sysfs.path(f"{base}/{entry}"))
            except FileNotFoundError:
                continue  # the domain stopped meanwhile
            except (ET.ParseError, OSError):
                found.unreadable.append(f"{base}/{entry}")
                continue
            domain = tree.find(".//domain/name")
            name = domain.text if domain is not None and domain.text else entry[:-4]
            # <hostdev type='pci'> and <interface type='hostdev'> (SR-IOV NICs); a USB
            # or SCSI hostdev's address is not a PCI address.
            sources = [
                *(h for h in tree.iterfind(".//hostdev") if h.get("type", "pci") == "pci"),
                *tree.iterfind(".//interface[@type='hostdev']"),
            ]
            for addr in (a for h in sources for a in h.iterfind("source/address")):
                if addr.get("type", "pci") != "pci":
                    continue
                try:
                    pci = "{:04x}:{:02x}:{:02x}.{:x}".format(
                        *(int(addr.get(k, "0"), 0) for k in ("domain", "bus", "slot", "function"))
                    )
                except ValueError:
                    found.unreadable.append(f"{base}/{entry}")
                    continue
                found.hostdevs[pci] = name
        return found

    def usage(self, pci: str) -> Usage:
        if pci in self.hostdevs:
            return Usage(
                Use.IN_USE, (f"libvirt domain {self.hostdevs[pci]!r} has it as a hostdev",)
            )
        if self.failed is not None:
            return Usage(Use.UNKNOWN, (f"{self.failed}: libvirt's domains are unknown",))
        if self.unreadable:
            files = ", ".join("/" + f for f in self.unreadable[:3])
            return Usage(Use.UNKNOWN, (f"libvirt status {files} could not be read",))
        return FREE


def libvirt_hostdevs(sysfs: Sysfs) -> dict[str, str]:
    return Libvirt.scan(sysfs).hostdevs


class NetnsBackend(Protocol):
    """What ``Namespaces`` asks the kernel (``NetnsQuery``; a fake in tests)."""

    def foreign_netdevs(self) -> list[ForeignNetdev]: ...

    def nsid_of(self, ns_file: str) -> int | None: ...


class Namespaces:
    """Where a VF's netdev went when it is not in this namespace; built on first need.

    ``backend`` None: rtnetlink in this namespace (only meaningful for Sysfs("/")).
    """

    def __init__(self, sysfs: Sysfs, backend: NetnsBackend | None = None) -> None:
        self.sysfs = sysfs
        self._backend = backend
        self._foreign: list[ForeignNetdev] | None = None
        self._error: str | None = None
        self._tree = False  # a tree (not the live host) has no other namespace to look in
        self._by_nsid: dict[int, list[str]] | None = None

    def _load(self) -> list[ForeignNetdev]:
        if self._foreign is None:
            try:
                if self._backend is None:
                    if os.path.realpath(self.sysfs.root) != "/":
                        self._tree = True
                        raise OSError(
                            f"namespaces are not looked up for the tree {self.sysfs.root}"
                        )
                    self._backend = NetnsQuery()
                own = self._backend.nsid_of(self.sysfs.path("proc/self/ns/net"))
                self._foreign = [f for f in self._backend.foreign_netdevs() if f.nsid != own]
            except (KernelError, OSError) as exc:
                self._error = str(exc)
                self._foreign = []
        return self._foreign

    def usage(self, pci: str, driver: str, *, netdev_optional: bool = False) -> Usage:
        """In use when the function's netdev is in another namespace. Not found:
        unknown, unless ``netdev_optional`` (an InfiniBand function without IPoIB has
        none) and the look itself worked (or there is nowhere else to look: a tree):
        free."""
        hit = next((f for f in self._load() if f.parent == pci), None)
        if hit is not None:
            return Usage(
                Use.IN_USE, (f"netdev {hit.name} is in network namespace {self.label(hit.nsid)}",)
            )
        if netdev_optional and (self._error is None or self._tree):
            return FREE
        why = f"; looking for it failed: {self._error}" if self._error else ""
        return Usage(
            Use.UNKNOWN,
            (
                f"bound to {driver} but its netdev is not in this network namespace "
                f"and was not found in another{why}",
            ),
        )

    def label(self, nsid: int) -> str:
        """'NAME' (ip netns) or nsid N, with the processes living in it."""
        self._load()
        if self._backend is None:
            return f"nsid {nsid}"
        # Names for the message only (the VF is in use whatever they are): listings
        # that fail leave the namespace named by its id.
        names = [
            repr(n)
            for n in self.sysfs.listdir("run/netns")
            if self._backend.nsid_of(self.sysfs.path(f"run/netns/{n}")) == nsid
        ]
        label = ", ".join(names) if names else f"nsid {nsid}"
        pids = self._pids().get(nsid, [])
        if not pids:
            return f"{label} (no process in it)"
        more = len(pids) - _PIDS_NAMED
        shown = ", ".join(f"pid {p} ({self.sysfs.comm(p)})" for p in pids[:_PIDS_NAMED])
        return f"{label} ({shown}{f' and {more} more' if more > 0 else ''})"

    def _pids(self) -> dict[int, list[str]]:
        """nsid -> pids: one stat per pid, one rtnetlink query per distinct namespace."""
        if self._by_nsid is None:
            self._by_nsid = {}
            if self._backend is None:
                return self._by_nsid
            groups: dict[tuple[int, int], list[str]] = {}
            try:
                pids = self.sysfs.pids()
            except Unreadable:
                return self._by_nsid  # no process named; the usage stays IN_USE
            for pid in pids:
                ns = self.sysfs.netns_id(f"proc/{pid}/ns/net")
                if ns is not None:
                    groups.setdefault(ns, []).append(pid)
            for pids in groups.values():
                nsid = self._backend.nsid_of(self.sysfs.path(f"proc/{pids[0]}/ns/net"))
                if nsid is not None:
                    self._by_nsid.setdefault(nsid, []).extend(pids)
        return self._by_nsid


def uverbs_nodes(sysfs: Sysfs, ib_device: str) -> list[str]:
    """/dev/infiniband/uverbsN nodes that belong to an RDMA device; Unreadable when the
    nodes or their devices cannot be read. No infiniband_verbs class: ib_uverbs is not
    loaded, so no process can have a device open; a node gone meanwhile is not there."""
    base = "sys/class/infiniband_verbs"
    return [
        f"/dev/infiniband/{n}"
        for n in sysfs.entries(base, optional=True)
        if n.startswith("uverbs") and sysfs.read_known(f"{base}/{n}/ibdev") == ib_device
    ]


def rdma_device_usage(sysfs: Sysfs, files: OpenFiles, ib_device: str) -> Usage:
    """User-space holders of an RDMA device: its uverbs nodes open in some process."""
    try:
        nodes = uverbs_nodes(sysfs, ib_device)
    except Unreadable as exc:
        return combine(Usage(Use.UNKNOWN, (exc.reason,)), files.unknown() or FREE)
    holders = files.holding(nodes)
    if holders:
        return Usage(Use.IN_USE, tuple(holders))
    return files.unknown() or FREE


def rdma_link_usage(sysfs: Sysfs, files: OpenFiles, link: RdmaLinkObserved) -> Usage:
    """The link's netlink-derived usage (kernel users, RES_GET) with its uverbs holders."""
    return combine(link.usage, rdma_device_usage(sysfs, files, link.name))


def vf_usage(
    sysfs: Sysfs,
    files: OpenFiles,
    libvirt: Libvirt | dict[str, str],
    vf_pci: str,
    rdma_links: Sequence[RdmaLinkObserved] = (),
    namespaces: Namespaces | None = None,
    fn: PciFunction | None = None,
) -> Usage:
    """Everything that holds the VF. ``rdma_links`` carry their usage already combined
    (``rdma_link_usage``); ``namespaces`` None looks hidden netdevs up over rtnetlink.
    ``fn``: the VF as the caller just read it (a pass reads each VF once), else read."""
    if fn is None:
        try:
            # Gone only when the kernel says so (ENOENT), not when the look failed.
            if not sysfs.present(f"{PCI_DEVICES}/{vf_pci}"):
                return FREE  # gone: nothing can hold it
        except Unreadable as exc:
            return Usage(Use.UNKNOWN, (exc.reason,))
        fn = sysfs.pci_function(vf_pci)
    if fn is None:
        return FREE  # gone: nothing can hold it
    if isinstance(libvirt, dict):
        libvirt = Libvirt(hostdevs=libvirt)
    found = [libvirt.usage(vf_pci)]
    if fn.unreadable:
        found.append(Usage(Use.UNKNOWN, fn.unreadable))
    if fn.driver == "vfio-pci" and fn.iommu_group is None:
        found.append(
            Usage(Use.UNKNOWN, ("bound to vfio-pci without an iommu_group: holders unknown",))
        )
    if fn.driver in PASSTHROUGH_DRIVERS:
        try:
            nodes = sysfs.vfio_cdevs(vf_pci)
        except Unreadable as exc:
            found.append(Usage(Use.UNKNOWN, (exc.reason,)))
            nodes = []
        if fn.iommu_group is not None:
            nodes += [f"/dev/vfio/{fn.iommu_group}", f"/dev/vfio/noiommu-{fn.iommu_group}"]
        found.append(_held(files.holding(nodes)))
    own = set(fn.ib_devices)
    for ib in fn.ib_devices:
        link = next((r for r in rdma_links if r.name == ib), None)
        found.append(link.usage if link is not None else rdma_device_usage(sysfs, files, ib))
    netdev = sysfs.own_netdev(fn.netdevs)
    if netdev is not None:
        ifindex = sysfs.read_int(f"sys/class/net/{netdev}/ifindex")
        for link in rdma_links:
            on_netdev = link.netdev == netdev or (
                ifindex is not None and link.netdev_ifindex == ifindex
            )
            if on_netdev and link.name not in own:
                kind = link.driver or "RDMA"
                carries = Usage(Use.IN_USE, (f"{netdev} carries {kind} link {link.name}",))
                found += [carries, link.usage]
    bound_to_kernel_driver = fn.driver is not None and fn.driver not in PASSTHROUGH_DRIVERS
    if bound_to_kernel_driver and not fn.netdevs:
        # Not here: in a pod's namespace, whatever RDMA device stayed behind here.
        optional = bool(fn.ib_devices) and not any(
            _has_ethernet_port(sysfs, ib) for ib in fn.ib_devices
        )
        found.append(
            (namespaces or Namespaces(sysfs)).usage(
                vf_pci, fn.driver or "?", netdev_optional=optional
            )
        )
    usage = combine(*found)
    if usage.state is Use.IN_USE:
        return usage  # a known holder is what an operator needs
    # Free or unknown so far: every reason the open files are unknown counts too.
    return combine(usage, files.unknown() or FREE)


def representor_usage(
    sysfs: Sysfs, netdev: str, rdma_links: Sequence[RdmaLinkObserved] = ()
) -> Usage:
    """What uses a VF representor netdev, which an eSwitch mode change or a numvfs
    change destroys with the VF's vport: a master (an OVS datapath, a bridge, a bond),
    an RDMA link on it (busy like one on a VF's netdev), and its link's users. Not in
    this namespace, or a read that fails: unknown."""
    base = f"sys/class/net/{netdev}"
    try:
        if not sysfs.present(base):
            return Usage(Use.UNKNOWN, (f"representor {netdev} is not in this network namespace",))
        master = sysfs.link_known(f"{base}/master")
    except Unreadable as exc:
        return Usage(Use.UNKNOWN, (exc.reason,))
    found = []
    if master is not None:
        found.append(Usage(Use.IN_USE, (f"representor {netdev} is a port of {master}",)))
    ifindex = sysfs.read_int(f"{base}/ifindex")
    for link in rdma_links:
        if link.netdev == netdev or (ifindex is not None and link.netdev_ifindex == ifindex):
            kind = link.driver or "RDMA"
            said = f"representor {netdev} carries {kind} link {link.name}"
            found += [Usage(Use.IN_USE, (said,)), link.usage]
    return combine(*found)


def representor_usage_now(
    sysfs: Sysfs, netdev: str, rdma_links: Sequence[RdmaLinkObserved] = ()
) -> Usage:
    """The same with the links' uverbs holders scanned again (a re-check, the guard)."""
    files = OpenFiles.scan(sysfs)
    links = [replace(r, usage=rdma_link_usage(sysfs, files, r)) for r in rdma_links]
    return representor_usage(sysfs, netdev, links)


def _has_ethernet_port(sysfs: Sysfs, ib_device: str) -> bool:
    """Whether an RDMA device has a RoCE port (link_layer Ethernet): such a function
    always has a netdev. A port that cannot be read counts as one (the netdev is then
    looked for, and its absence is unknown, not free)."""
    base = f"{CLASS_IB}/{ib_device}/ports"
    ports = sysfs.listdir(base)
    if not ports:
        return True
    return any(sysfs.read(f"{base}/{port}/link_layer") in (None, "Ethernet") for port in ports)


def _held(holders: list[str]) -> Usage:
    return Usage(Use.IN_USE, tuple(holders)) if holders else FREE


def rdma_links_from_sysfs(sysfs: Sysfs, files: OpenFiles) -> tuple[RdmaLinkObserved, ...]:
    """RDMA devices as sysfs shows them, with their uverbs holders (no kernel users: only
    RDMA netlink knows those) and, as over netlink, port 1's state and an rxe link's
    GIDs (whether it can serve: a DOWN link, or one with no GID of an IP address, is
    not converged on this path either). Unreadable when the devices cannot be listed: a
    VF whose netdev carries an rxe link is in use, so "no links" must not be guessed. No
    infiniband class: ib_core is not loaded, there is no RDMA device."""
    out = []
    for dev in sysfs.entries(CLASS_IB, optional=True):
        ndevs = sysfs.ib_port_netdevs(dev)
        parent = sysfs.ib_attr(dev, "parent")
        netdev = parent or (ndevs[0] if ndevs else None)
        driver = sysfs.ib_driver(dev)
        out.append(
            RdmaLinkObserved(
                name=dev,
                driver=driver,
                netdev=netdev,
                netdev_ifindex=sysfs.read_int(f"sys/class/net/{netdev}/ifindex")
                if netdev
                else None,
                usage=rdma_device_usage(sysfs, files, dev),
                port_state=sysfs.ib_port_state(dev),
                gids=sysfs.ib_gids(dev) if driver == "rxe" else None,
            )
        )
    return tuple(out)


# --- a fresh look right before a destructive write ---------------------------------------------


def rdma_link_usage_now(sysfs: Sysfs, link: RdmaLinkObserved) -> Usage:
    """The link's netlink-derived usage combined with a fresh scan of open uverbs files."""
    return rdma_link_usage(sysfs, OpenFiles.scan(sysfs), link)


def vf_usage_now(sysfs: Sysfs, vf_pci: str, rdma_links: Sequence[RdmaLinkObserved] = ()) -> Usage:
    """Everything holding the VF, from a fresh /proc walk and libvirt read.

    ``rdma_links`` are the links as RDMA netlink reported them (their ``usage`` is the
    kernel-user view); their uverbs holders are scanned again here.
    """
    files = OpenFiles.scan(sysfs)
    links = [replace(r, usage=rdma_link_usage(sysfs, files, r)) for r in rdma_links]
    return vf_usage(sysfs, files, Libvirt.scan(sysfs), vf_pci, links)
