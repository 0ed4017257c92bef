"""What the kernel shows (frozen msgspec Structs filled by rdmad.kernel, read by the
planner; cheap to define at start-up and to build by the hundred), and what rdmad
remembers between passes.

What the driver guard reads too (``Usage``, ``RdmaLinkObserved``, ``PauseObserved``,
the guard hook's ``GuardHookObserved`` and ``OpenibdObserved``) is
in ``rdmad.model.shared_observed``, standard library dataclasses, re-exported here;
``UnsupportedKey`` stays a dataclass for its field left out of comparisons."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from rdmad.managers.facts import PfManagers

# What the guard reads too: dataclasses, standard library only (see that module).
from rdmad.model.shared_observed import (
    FREE,
    GuardHookObserved,
    OpenibdObserved,
    PauseObserved,
    RdmaLinkObserved,
    Usage,
    Use,
)
from rdmad.modsupport import RXE, Support, cannot_load
from rdmad.peermem.choice import Held, Mode
from rdmad.peermem.facts import PeermemFacts

__all__ = [
    "FREE",
    "EswitchObserved",
    "GuardHookObserved",
    "IbVfSettings",
    "ModulesObserved",
    "NetdevObserved",
    "ObserveScope",
    "Observed",
    "OpenibdObserved",
    "PauseObserved",
    "PfObserved",
    "PlanState",
    "RdmaLinkObserved",
    "RdmaSysObserved",
    "UnsupportedKey",
    "Usage",
    "Use",
    "VfObserved",
    "VfSettings",
]

# --- observed state (what the kernel shows) --------------------------------------------


class VfSettings(msgspec.Struct, frozen=True):
    """VF attributes as rtnetlink reports them on the PF (IFLA_VFINFO_LIST).

    ``None`` in a field means the kernel did not report that attribute.
    """

    mac: str | None = None
    vlan: int | None = None
    qos: int | None = None
    vlan_proto: str | None = None
    spoofchk: bool | None = None
    trust: bool | None = None
    link_state: str | None = None
    min_tx_rate: int | None = None
    max_tx_rate: int | None = None
    query_rss: bool | None = None


class IbVfSettings(msgspec.Struct, frozen=True):
    """InfiniBand VF identity from /sys/class/infiniband/DEV/device/sriov/N/."""

    node_guid: str | None = None
    port_guid: str | None = None
    policy: str | None = None


class VfObserved(msgspec.Struct, frozen=True):
    index: int
    pci: str | None  # None while the VF's PCI device has not appeared yet
    driver: str | None = None
    driver_override: str | None = None
    netdev: str | None = None
    settings: VfSettings | None = None  # None: not readable (see PfObserved.settings_note)
    ib: IbVfSettings | None = None  # None: not an InfiniBand PF
    usage: Usage = FREE
    representor: str | None = None  # the VF's representor netdev (switchdev mode)
    # What uses the representor (an OVS bridge, an rxe link on it...): gone with the
    # VF's vport, which an eSwitch mode change and a numvfs change re-create.
    representor_usage: Usage = FREE

    @property
    def vport_busy(self) -> bool:
        """Whether destroying the VF's vport (the VF and its representor) hurts someone."""
        return self.usage.busy or self.representor_usage.busy

    def vport_holders(self) -> str:
        """Who holds the VF or its representor, for a Blocked reason."""
        parts = [u.describe() for u in (self.usage, self.representor_usage) if u.busy]
        return "; ".join(parts) if parts else "free"


class EswitchObserved(msgspec.Struct, frozen=True):
    """A PF's eSwitch as devlink shows it (``devlink dev eswitch show``).

    ``mode`` is None when the PF has no eSwitch (``absent`` says why: no devlink
    instance, or its driver has no eSwitch) or when it could not be read (``unread``
    says why: unknown, so nothing is changed on it)."""

    mode: str | None = None  # "legacy" | "switchdev"
    inline_mode: str | None = None  # None: the driver does not say
    encap_mode: str | None = None
    absent: str | None = None
    unread: str | None = None


class PfObserved(msgspec.Struct, frozen=True):
    pci: str
    driver: str | None
    netdev: str | None
    ifindex: int | None
    mac: str | None
    perm_mac: str | None
    numvfs: int
    totalvfs: int
    drivers_autoprobe: bool | None = True  # None: no sriov_drivers_autoprobe (netdevsim)
    autoprobe_unread: str | None = None  # the file is there but could not be read: unknown
    operstate_up: bool | None = None
    vfs: tuple[VfObserved, ...] = ()
    # Why VF settings are None, when they are (truncated list, netlink not read...).
    settings_note: str | None = None
    ib_device: str | None = None
    # The kernel module behind ``driver`` (what `modprobe -r` names); None when the PF is
    # unbound or its driver is built in (nothing can unload it, nothing to guard).
    driver_module: str | None = None
    # None: devlink was not read (a sysfs tree without netlink).
    eswitch: EswitchObserved | None = None
    # PCI vendor and device ID, 4 lowercase hex digits ("15b3", "1017"), what a
    # [[sriov]] selector matches on; None for a PF that is no PCI function (netdevsim).
    vendor: str | None = None
    device: str | None = None
    # What other network managers declare for this PF (rdmad.managers); None: not looked
    # at (a hand-built snapshot).
    managers: PfManagers | None = None
    # udevd runs and has not yet processed the PF (no udev database entry for it):
    # * with no driver bound, its PCI device: the driver its modalias names may still be
    #   loaded (at boot, before coldplug reached it), and a [[sriov]] selector it could
    #   match waits for it (rdmad.reconcile.resolve);
    # * with a driver, its netdev, read only while that is down: its rename may still
    #   come, and before Linux 6.2 the kernel refuses to rename an interface that is up
    #   (EBUSY), and udev before systemd 253 does not try, so setting it up is what would
    #   hurt (rdmad.reconcile.sriov.PF_UP_DRIVERS).
    udev_pending: bool = False
    # The path under /run/udev whose lookup failed (not ENOENT) while udev_pending was
    # worked out: whether udev has processed the PF is then unknown, which waits as
    # "not yet" (udev_pending True), and the words say it is unknown, and why.
    udev_unread: str | None = None

    def vf(self, index: int) -> VfObserved | None:
        for v in self.vfs:
            if v.index == index:
                return v
        return None


class NetdevObserved(msgspec.Struct, frozen=True):
    name: str
    ifindex: int
    mac: str | None = None
    perm_mac: str | None = None
    pci: str | None = None
    up: bool = False


class ObserveScope(msgspec.Struct, frozen=True):
    """What a plan on the declaration asks of the costly sources, so that an observation
    reads those for it only (``rdmad.reconcile.observe_scope`` makes it from ``Desired``).

    ``modules``: the loadable modules whose availability a plan may ask about (the
    module tree, or /proc/kallsyms on a kernel without module support, is read for
    them). ``peermem``: the peer-memory mode; the module tree, the module files and
    /proc/kallsyms are read for it only where ``rdmad.peermem.choice.needs_all_facts``
    says its decision can turn on them. The default asks everything: an observer
    nobody told (a tool, a test) reads as much as it ever did.
    """

    modules: frozenset[str] = frozenset({RXE})
    peermem: Mode = "require"


class ModulesObserved(msgspec.Struct, frozen=True):
    loaded: frozenset[str] = frozenset()
    # "loadable"; "disabled": /proc/sys/kernel/modules_disabled = 1 (until reboot);
    # "none": built without CONFIG_MODULES (rdmad.modsupport)
    support: Support = "loadable"
    # GPUDirect peer memory: what decides whether and which module to load (rdmad.peermem).
    peermem: PeermemFacts = msgspec.field(default_factory=PeermemFacts)
    # Of the modules rdmad may load (rdma_rxe): those compiled into the kernel (nothing to
    # load, nothing to guard), and why one that is not in the kernel cannot be loaded.
    builtin: frozenset[str] = frozenset()
    unavailable: tuple[tuple[str, str], ...] = ()

    @property
    def loading_disabled(self) -> bool:
        return self.support != "loadable"

    def present(self, module: str) -> bool:
        """In the kernel now: loaded, or built in."""
        return module in self.loaded or module in self.builtin

    def cannot_load(self, module: str) -> str | None:
        """Why ``module`` cannot be loaded, in words; None when modprobe may work."""
        if self.present(module):
            return None
        why = dict(self.unavailable).get(module)
        return why if why is not None else cannot_load(module, self.support, "unknown")


class RdmaSysObserved(msgspec.Struct, frozen=True):
    """The RDMA subsystem's network-namespace mode (rdmad.kernel.ibcore).

    ``netns_mode``: "shared" or "exclusive" now; None while ib_core is not loaded.
    ``boot_mode``: what rdmad's modprobe.d file gives ib_core at its next load; None
    without the file (or a file without rdmad's line: ``boot_file_current`` False).
    ``namespaces``: the network namespaces besides the host's that could be seen, which
    make the kernel refuse a change (EBUSY); read only while a change is pending, else
    None. ``namespaces_unknown``: what could not be read (they name; the kernel decides).
    """

    netns_mode: str | None = None
    boot_mode: str | None = None
    boot_file: bool = False
    boot_file_current: bool = True
    namespaces: tuple[str, ...] | None = None
    namespaces_unknown: str | None = None


class Observed(msgspec.Struct, frozen=True):
    netdevs: tuple[NetdevObserved, ...] = ()
    pfs: tuple[PfObserved, ...] = ()  # every SR-IOV capable PCI function
    rdma_links: tuple[RdmaLinkObserved, ...] = ()
    modules: ModulesObserved = msgspec.field(default_factory=ModulesObserved)
    # False only when the kernel is known to have no NETLINK_RDMA: rxe can never work there.
    rdma_netlink: bool = True
    notes: tuple[str, ...] = ()  # what could not be read, in words
    # None: the hook file was not looked at (a hand-built snapshot): nothing is planned for it.
    guard_hook: GuardHookObserved | None = None
    pause: PauseObserved | None = None  # only while in force
    # The last pause written, in force or over (ended_why says why): the history's view.
    pause_record: PauseObserved | None = None
    # None: not looked at (a hand-built snapshot): nothing is planned for [rdma].
    rdma_sys: RdmaSysObserved | None = None
    # /etc/machine-id (32 lowercase hex digits), for MACs derived from it; None when
    # absent or not one (a container without the host's): such MACs are not derived.
    machine_id: str | None = None

    def netdev(self, name: str) -> NetdevObserved | None:
        for n in self.netdevs:
            if n.name == name:
                return n
        return None

    def rdma_link(self, name: str) -> RdmaLinkObserved | None:
        for r in self.rdma_links:
            if r.name == name:
                return r
        return None


# --- state kept between passes ----------------------------------------------------------


class PlanState(msgspec.Struct, frozen=True):
    """What rdmad remembers that the kernel does not tell: what it created.

    Losing it is safe: rdmad then owns nothing and removes nothing.
    """

    managed_rxe: frozenset[str] = frozenset()
    # VF attributes a driver refused as unsupported, not retried until the config or
    # the PF's driver changes.
    unsupported: frozenset[UnsupportedKey] = frozenset()
    # A peermem load that failed for a lasting reason: not retried while the facts it
    # failed on are the same (rdmad.peermem.choice.decide).
    peermem_held: Held | None = None


@dataclass(frozen=True, slots=True, order=True)
class UnsupportedKey:
    """A VF attribute a PF driver refused (EOPNOTSUPP, EPROTONOSUPPORT, EINVAL)."""

    pci: str  # the PF
    driver: str  # the PF's driver when it refused
    vf: int
    attr: str
    value: str  # format_value() of what was refused: another value may work
    error: str = field(default="", compare=False)  # what the kernel said, for status
