"""The guard's decision: what unloading a module (or stopping a PF) would take away.

A target is a module or driver name (``igb``, ``mlx5_core``, ``rdma_rxe``) or a PCI
address (a PF: its VFs; a VF: itself). For a module, every PCI function bound to one
of its drivers counts, with the VFs of those that are PFs: unloading the module
destroys them all. Each VF's usage is ``rdmad.kernel.usage.holders.vf_usage`` (the planner's
own: vfio group and iommufd holders, libvirt hostdevs, a netdev in another network
namespace, users of an RDMA device on it, an RDMA link on its netdev). For
``rdma_rxe`` every rxe link's users count. Unknown is in use: a listing that fails
(the module's drivers, a driver's devices, a PF's VFs, /proc, libvirt's domains, the
RDMA devices) holds the unload, naming why ("cannot list /proc: Too many open files").

The RDMA links (for kernel users, RDMA netlink resource tracking) are passed in by the
caller: reading them needs a socket, and only when ib_core is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rdmad.kernel.sysfs import PCI_DEVICES, Sysfs
from rdmad.kernel.sysfs_files import Unreadable
from rdmad.kernel.usage.holders import (
    Libvirt,
    Namespaces,
    OpenFiles,
    combine,
    rdma_link_usage,
    representor_usage,
    vf_usage,
)
from rdmad.model.shared_observed import RdmaLinkObserved, Usage, Use

RXE_MODULE = "rdma_rxe"
_FULL_PCI = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_SHORT_PCI = re.compile(r"^[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$")
FORCE_HINT = "set RDMAD_GUARD_FORCE=1 (or --force) to override; the override is logged"


class TargetError(ValueError):
    """The target names nothing the guard can check (exit 2, nothing decided)."""


@dataclass(frozen=True, slots=True)
class Held:
    """One thing in use that the unload would take away."""

    what: str  # "VF 1 (0000:01:10.2) of PF 0000:01:00.0"
    usage: Usage

    def advice(self) -> list[str]:
        return [a for h in self.usage.holders if (a := advice_for(h))] or [
            "find who uses it before unloading; rdmad could not name a holder"
        ]


@dataclass(frozen=True, slots=True)
class Decision:
    target: str
    modules: tuple[str, ...]  # the loaded modules the target stands for ("igb")
    checked: tuple[str, ...] = ()  # what was looked at, in words
    held: tuple[Held, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return not self.held

    def explain(self) -> str:
        """The refusal in words an operator can act on (or the allowance, in one line)."""
        if self.allowed:
            seen = "; ".join(self.checked) or "nothing to check"
            return f"{self.target}: nothing in use ({seen})"
        lines = [f"{self.target}: refused, in use:"]
        for h in self.held:
            lines.append(f"  {h.what}: {h.usage.describe()}")
            lines.extend(f"    -> {a}" for a in h.advice())
        lines.append(f"  {FORCE_HINT}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "modules": list(self.modules),
            "allowed": self.allowed,
            "checked": list(self.checked),
            "held": [
                {
                    "what": h.what,
                    "state": h.usage.state.value,
                    "holders": list(h.usage.holders),
                    "advice": h.advice(),
                }
                for h in self.held
            ],
            "notes": list(self.notes),
        }


def advice_for(holder: str) -> str | None:
    """What to do about one holder, from the words ``usage`` describes it with."""
    if m := re.match(r"libvirt domain '([^']+)'", holder):
        return f"shut down VM {m.group(1)} (virsh shutdown {m.group(1)}) or detach the VF"
    if m := re.match(r"(pid \d+ \([^)]*\)) holds (/dev/vfio/\S+)", holder):
        return f"stop {m.group(1)}: it holds the VF through {m.group(2)} (a VM or a DPDK app)"
    if m := re.match(r"(pid \d+ \([^)]*\)) holds (/dev/infiniband/\S+)", holder):
        return f"stop {m.group(1)}: it has the RDMA device open ({m.group(2)})"
    if m := re.match(r"netdev (\S+) is in network namespace (.*)", holder):
        return (
            f"move the netdev back (ip -n NS link set {m.group(1)} netns 1) or stop what "
            f"lives in namespace {m.group(2)}"
        )
    if m := re.match(r"(\S+) carries (\S+) link (\S+)", holder):
        return (
            f"delete RDMA link {m.group(3)} on {m.group(1)} (rdma link delete {m.group(3)}); "
            "if rdmad declares it, remove it from the config first"
        )
    if holder.startswith("kernel user"):
        return f"stop the {holder} (unmount NFS over RDMA, log out of iSER / NVMe-oF)"
    if m := re.match(r"(pid \d+ \([^)]*\)): ", holder):
        return f"stop {m.group(1)}: it has RDMA resources on the device"
    return None


def normalize_pci(text: str) -> str | None:
    if _FULL_PCI.match(text):
        return text.lower()
    if _SHORT_PCI.match(text):
        return f"0000:{text.lower()}"
    return None


def devices_of(sysfs: Sysfs, name: str) -> tuple[list[str], list[str]]:
    """(the loaded module(s) ``name`` stands for, the PCI functions bound to their drivers).

    Unreadable when they cannot be listed. A module without a drivers/ directory
    registered no driver; a driver directory that went away has no devices.
    """
    module = name.replace("-", "_")
    modules: list[str] = []
    drivers: set[str] = set()
    if sysfs.exists(f"sys/module/{module}"):
        modules.append(module)
        for entry in sysfs.entries(f"sys/module/{module}/drivers", optional=True):
            bus, _, driver = entry.partition(":")
            if bus == "pci":
                drivers.add(driver)
    if sysfs.exists(f"sys/bus/pci/drivers/{name}"):  # a driver name: its module, if any
        drivers.add(name)
        owner = sysfs.link_name(f"sys/bus/pci/drivers/{name}/module")  # None: built in
        if owner and owner not in modules:
            modules.append(owner)
    devices = sorted(
        d
        for drv in drivers
        for d in sysfs.entries(f"sys/bus/pci/drivers/{drv}", optional=True)
        if _FULL_PCI.match(d)
    )
    return modules, devices


def decide(
    sysfs: Sysfs,
    target: str,
    rdma_links: Sequence[RdmaLinkObserved],
    *,
    rdma_note: str | None = None,
    rdma_unknown: str | None = None,
    files: OpenFiles | None = None,
) -> Decision:
    """Whether ``target`` may go; raises TargetError for a target that names nothing.

    ``rdma_unknown``: why the RDMA links could not be listed at all; then every VF
    (one may carry an rxe link) and every rxe link count as unknown.
    """
    files = files if files is not None else OpenFiles.scan(sysfs)
    notes = [rdma_note] if rdma_note else []
    if unknown := files.unknown():
        notes.append(unknown.describe())
    blind = Usage(Use.UNKNOWN, (f"{rdma_unknown}: RDMA links unknown",)) if rdma_unknown else None
    pci = normalize_pci(target)
    if pci is not None:
        if not sysfs.exists(f"{PCI_DEVICES}/{pci}"):
            raise TargetError(f"{target}: no PCI device at that address")
        return _decide_devices(sysfs, target, (), [pci], rdma_links, files, notes, blind)
    if not _NAME.match(target):
        raise TargetError(f"{target!r} is neither a module or driver name nor a PCI address")
    try:
        modules, devices = devices_of(sysfs, target)
    except Unreadable as exc:
        held = Held(f"the devices of {target}", Usage(Use.UNKNOWN, (exc.reason,)))
        return Decision(target, (target.replace("-", "_"),), (), (held,), tuple(notes))
    if not modules and not devices:
        return Decision(
            target, (), (f"no module or PCI driver {target} is loaded",), (), tuple(notes)
        )
    if target.replace("-", "_") == RXE_MODULE:
        return _decide_rxe(sysfs, target, rdma_links, files, notes, blind)
    return _decide_devices(sysfs, target, tuple(modules), devices, rdma_links, files, notes, blind)


def _decide_devices(
    sysfs: Sysfs,
    target: str,
    modules: tuple[str, ...],
    devices: list[str],
    rdma_links: Sequence[RdmaLinkObserved],
    files: OpenFiles,
    notes: list[str],
    blind: Usage | None,
) -> Decision:
    libvirt = Libvirt.scan(sysfs)
    namespaces = Namespaces(sysfs)
    links = [_with_uverbs(sysfs, files, r) for r in rdma_links]
    checked: list[str] = []
    held: list[Held] = []
    vfs: dict[str, str] = {}  # VF PCI -> how to name it
    for dev in devices:
        try:
            virtfns = sysfs.virtfns(dev)
        except Unreadable as exc:  # its VFs are unknown: any of them may be in use
            held.append(Held(f"the VFs of {dev}", Usage(Use.UNKNOWN, (exc.reason,))))
            continue
        for index, vf in sorted(virtfns.items()):
            vfs.setdefault(vf, f"VF {index} ({vf}) of PF {dev}")
        physfn = sysfs.link_name(f"{PCI_DEVICES}/{dev}/physfn")
        if physfn is not None:
            vfs.setdefault(dev, f"VF {dev} of PF {physfn}")
        elif virtfns:
            checked.append(f"PF {dev}: {len(virtfns)} VF(s)")
            held += _representors_held(sysfs, dev, links)
        else:
            checked.append(f"{dev}: no VFs")
    busy = 0
    for vf, what in vfs.items():
        usage = vf_usage(sysfs, files, libvirt, vf, links, namespaces)
        if blind is not None:
            usage = combine(usage, blind)
        if usage.busy:
            held.append(Held(what, usage))
            busy += 1
    free = len(vfs) - busy
    if free:
        checked.append(f"{free} VF(s) free")
    return Decision(target, modules, tuple(checked), tuple(held), tuple(notes))


def _representors_held(sysfs: Sysfs, pf: str, links: Sequence[RdmaLinkObserved]) -> list[Held]:
    """The PF's VF representors in use (unloading the PF driver destroys them)."""
    try:
        representors = sysfs.vf_representors(pf)
    except Unreadable as exc:
        return [Held(f"the VF representors of PF {pf}", Usage(Use.UNKNOWN, (exc.reason,)))]
    return [
        Held(f"the representor {netdev} of VF {index} of PF {pf}", usage)
        for index, netdev in sorted(representors.items())
        if (usage := representor_usage(sysfs, netdev, links)).busy
    ]


def _decide_rxe(
    sysfs: Sysfs,
    target: str,
    rdma_links: Sequence[RdmaLinkObserved],
    files: OpenFiles,
    notes: list[str],
    blind: Usage | None,
) -> Decision:
    rxe = [r for r in rdma_links if r.is_rxe]
    held = [
        Held(f"rxe link {r.name} on {r.netdev or '?'}", usage)
        for r in rxe
        if (usage := rdma_link_usage(sysfs, files, r)).busy
    ]
    if blind is not None:
        held.append(Held("the rxe links", blind))
    checked = (f"{len(rxe)} rxe link(s)",)
    return Decision(target, (RXE_MODULE,), checked, tuple(held), tuple(notes))


def _with_uverbs(sysfs: Sysfs, files: OpenFiles, link: RdmaLinkObserved) -> RdmaLinkObserved:
    """The link with its uverbs holders added to its kernel users, as ``observe`` has it."""
    return replace(link, usage=rdma_link_usage(sysfs, files, link))


__all__ = ["FORCE_HINT", "Decision", "Held", "TargetError", "decide"]
